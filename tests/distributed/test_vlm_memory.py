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
from bigtrain.planner.model_stats import ModelStats
from bigtrain.planner.vision_stats import VisionStats

sys.path.insert(0, str(REPO / "bench"))
from vlm_memory import run_vlm_case  # noqa: E402

WHOLE_GEMMA = "full-gemma-3-4b-4x896px-27blocks-L2048-fsdp23-N8-none"
DEFAULT_TIER = ("full-qwen2.5-vl-7b-2x1024px-2blocks-L4096-fsdp23-N8-none", WHOLE_GEMMA)
TESTED = [c for c in VLM_MEMORY_CASES if c.name not in BENCH_ONLY]
CASES = [pytest.param(c, id=c.name, marks=() if c.name in DEFAULT_TIER else pytest.mark.full) for c in TESTED]
_SIMULATED: dict[str, int] = {}


def _simulated(case: VlmCase) -> int:
    if case.name not in _SIMULATED:
        _SIMULATED[case.name] = run_vlm_case(case)[1]
    return _SIMULATED[case.name]


def _error(case: VlmCase) -> float:
    predicted = estimate_memory(ModelStats.from_config(case.config()), case.plan(), case.workload()).total_bytes
    return predicted / _simulated(case) - 1


def test_the_cases_span_what_the_issue_names():
    assert {c.preset for c in VLM_MEMORY_CASES} == {"qwen2.5-vl-7b", "gemma-3-4b"}
    assert {c.images for c in TESTED} >= {1, 2, 4} and {c.method for c in TESTED} == {"full", "lora", "qlora"}
    assert min(c.image_size for c in TESTED) == 448 and max(c.image_size for c in TESTED) == 1024
    assert set(DEFAULT_TIER) <= {c.name for c in TESTED}
    config = next(c for c in TESTED if c.name == DEFAULT_TIER[0]).config()  # real widths, trimmed depth
    assert config["text_config"]["hidden_size"] == 3584 and config["vision_config"]["hidden_size"] == 1280
    assert config["text_config"]["num_hidden_layers"] == 2 and config["vision_config"]["depth"] == 2


@pytest.mark.parametrize("case", CASES)
def test_within_10_percent_of_the_simulated_step(case):
    assert abs(_error(case)) <= 0.10


@pytest.mark.full
def test_the_median_is_within_5_percent():
    assert statistics.median(abs(_error(c)) for c in TESTED) <= 0.05


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
