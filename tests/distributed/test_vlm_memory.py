"""Vision-language models at the widths users train (Qwen2.5-VL-7B, Gemma-3-4B; two decoder layers, two vision
blocks or the whole tower): the planner's peak against bigtrain's own step simulated on fake tensors, 1 to 4 images
of 448 to 1024 pixels per row, full fine-tuning and LoRA. Every case within 10%, the median within 5%, and a 25%
error in the tower's terms is noticed. ``python bench/vlm_memory.py`` prints the table (bench/results/vlm_memory.md,
which also holds Qwen's whole 32-block tower: two minutes to simulate, so not run here)."""

from __future__ import annotations

import statistics
import sys
from unittest import mock

import pytest
from helpers import REPO
from vlm_cases import BENCH_ONLY, VLM_MEMORY_CASES, VlmCase

from bigtrain.planner.memory import estimate_memory
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.planner.vision_stats import VisionStats

sys.path.insert(0, str(REPO / "bench"))
from vlm_memory import run_vlm_case  # noqa: E402

WHOLE_GEMMA = "full-gemma-3-4b-4x896px-27blocks-L2048-fsdp23-N8-none"
# CI's cases (the full tier): Qwen's two blocks at 1024 px and Gemma's whole tower (the teeth below read it); the
# rest are the extended tier's, as bench/vlm_memory.py prints them all
CI_CASES = ("full-qwen2.5-vl-7b-2x1024px-2blocks-L4096-fsdp23-N8-none", WHOLE_GEMMA)
TESTED = [c for c in VLM_MEMORY_CASES if c.name not in BENCH_ONLY]
CASES = [
    pytest.param(c, id=c.name, marks=pytest.mark.full if c.name in CI_CASES else pytest.mark.extended) for c in TESTED
]
_SIMULATED: dict[str, int] = {}


def _simulated(case: VlmCase) -> int:
    if case.name not in _SIMULATED:
        _SIMULATED[case.name] = run_vlm_case(case)[1]
    return _SIMULATED[case.name]


def _error(case: VlmCase) -> float:
    predicted = estimate_memory(ModelStats.from_config(case.config()), case.plan(), case.workload()).total_bytes
    return predicted / _simulated(case) - 1


# the published configs (Qwen/Qwen2.5-VL-7B-Instruct, google/gemma-3-4b-it), typed by hand: (text, vision, params)
PUBLISHED_VLM = {
    "qwen2.5-vl-7b": (
        dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
             num_key_value_heads=4, vocab_size=152064),
        dict(hidden_size=1280, intermediate_size=3420, depth=32, num_heads=16, patch_size=14, spatial_merge_size=2,
             out_hidden_size=3584),
        8_292_166_656,
    ),
    "gemma-3-4b": (
        dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
             num_key_value_heads=4, head_dim=256, vocab_size=262208),
        dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16, patch_size=14,
             image_size=896),
        4_300_079_472,
    ),
}  # fmt: skip


def test_the_cases_are_the_published_models_at_their_real_widths():
    """Every case's model is the published one (its fields and parameter count, typed from the model cards), trimmed
    in depth only: the widths the within-10% comparisons rest on are the real ones."""
    assert set(CI_CASES) <= {c.name for c in TESTED}  # a renamed case would drop out of CI unseen
    for case in VLM_MEMORY_CASES:
        text, vision, params = PUBLISHED_VLM[case.preset]
        full = load_model_config(case.preset)
        assert ModelStats.from_config(full).params == params, case.preset
        trimmed = case.config()
        for key, value in text.items():
            expected = 2 if key == "num_hidden_layers" else value
            assert trimmed["text_config"][key] == expected and full["text_config"][key] == value, (case.name, key)
        for key, value in vision.items():
            expected = case.blocks if key in ("depth", "num_hidden_layers") else value
            assert trimmed["vision_config"][key] == expected and full["vision_config"][key] == value, (case.name, key)


@pytest.mark.parametrize("side, patches", [(448, 32 * 32), (768, 54 * 54), (1024, 74 * 74)])
def test_qwen_image_sizes_make_the_patches_and_tokens_its_processor_makes(side, patches):
    """The planner's image geometry against transformers' own Qwen2-VL image processor with the published
    preprocessor settings (14-pixel patches, 2 x 2 merge, 3136 to 12845056 pixels): 448 px -> 32 x 32 patches, 256
    image tokens; 1024 px -> 74 x 74 (1036 px: the nearest multiple of 28), 1369 tokens."""
    import numpy as np
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from bigtrain.config.hf import model_config_object
    from bigtrain.planner.vision_stats import vision_stats

    processor = Qwen2VLImageProcessorPil(
        patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=3136, max_pixels=12845056
    )
    grid = processor(images=[Image.fromarray(np.zeros((side, side, 3), np.uint8))], return_tensors="pt")
    assert int(grid["image_grid_thw"].prod()) == patches
    stats = vision_stats(model_config_object(load_model_config("qwen2.5-vl-7b")))
    assert stats.patches(side) == patches and stats.tokens(side) == patches // 4
    gemma = vision_stats(model_config_object(load_model_config("gemma-3-4b")))
    assert gemma.patches(896) == (896 // 14) ** 2 and gemma.tokens(896) == 256  # mm_tokens_per_image: 256


@pytest.mark.parametrize("case", CASES)
def test_within_10_percent_of_the_simulated_step(case):
    assert abs(_error(case)) <= 0.10


@pytest.mark.extended
def test_the_median_is_within_5_percent():
    assert statistics.median(abs(_error(c)) for c in TESTED) <= 0.05


@pytest.mark.full
def test_a_quarter_off_in_the_tower_s_terms_is_noticed():
    """Gemma 3's whole SigLIP tower, four images a row: what a block keeps per patch, or the patches an image makes,
    a quarter short moves the prediction outside 10% of the simulated step."""
    case = next(c for c in TESTED if c.name == WHOLE_GEMMA)
    assert abs(_error(case)) <= 0.10
    kept, patches = VisionStats.block_bytes_per_patch, VisionStats.patches
    with mock.patch.object(VisionStats, "block_bytes_per_patch", lambda s, a, c="none": kept(s, a, c) * 3 // 4):
        assert _error(case) < -0.10
    with mock.patch.object(VisionStats, "patches", lambda s, side: patches(s, side) * 3 // 4):
        assert _error(case) < -0.10
