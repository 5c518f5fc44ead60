"""The planner's vision-language terms: counts equal to the model's, image tokens as the processors make them, and
the memory terms' directions (frozen parts, LoRA, images per row, checkpointing)."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import make_plan

from bigtrain.config.workload import Workload
from bigtrain.planner.memory import estimate_memory
from bigtrain.planner.model_stats import ModelStats, load_model_config

PRESETS = ("qwen2.5-vl-7b", "gemma-3-4b", "smolvlm")


def stats(name: str) -> ModelStats:
    return ModelStats.from_config(load_model_config(name))


@pytest.mark.parametrize("name", PRESETS)
def test_counts_equal_the_numel_of_the_hf_model(name):
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    cfg = load_model_config(name)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    assert stats(name).params == sum(p.numel() for p in model.parameters())


def test_image_tokens_are_the_processors():
    """Qwen-VL: 14-pixel patches merged 2 x 2 (448 px: 32 x 32 patches, 256 tokens; 1024 px rounds to 1036: 1369);
    Gemma 3: 256 per image whatever its size; SmolVLM: 384-pixel tiles of 81 tokens, plus the whole image."""
    assert [stats("qwen2.5-vl-7b").vision.tokens(s) for s in (448, 1024)] == [256, 1369]
    assert [stats("gemma-3-4b").vision.tokens(s) for s in (448, 1024)] == [256, 256]
    assert [stats("smolvlm").vision.tokens(s) for s in (384, 448)] == [81, 405]


def test_memory_terms_move_the_way_the_run_does():
    s = stats("qwen2.5-vl-7b")
    plan = make_plan(dp_shard=8, micro_batch_size=2)
    base = Workload(seq_len=2048, global_batch_size=64, image_size=448, images_per_row=1.0)
    full = estimate_memory(s, plan, base)
    frozen = estimate_memory(s, plan, dataclasses.replace(base, frozen=("vision_tower",)))
    tower = s.vision.tower_params
    # no gradient (fp32) nor AdamW state (2 x fp32) for the frozen tower's shard, and none of its activations
    assert full.grads_bytes - frozen.grads_bytes == pytest.approx(4 * tower / 8, rel=0.01)
    assert full.optimizer_bytes - frozen.optimizer_bytes == pytest.approx(8 * tower / 8, rel=0.01)
    two = estimate_memory(s, plan, dataclasses.replace(base, images_per_row=2.0))
    assert two.total_bytes > full.total_bytes
    checkpointed = estimate_memory(s, dataclasses.replace(plan, activation_checkpointing="full"), base)
    assert checkpointed.activations_bytes < full.activations_bytes
    # LoRA: the tower is frozen base, kept in the compute dtype, its activations never saved
    lora = dataclasses.replace(base, method="lora")
    assert s.vision.activation_bytes(plan, lora) == 0 < s.vision.activation_bytes(plan, base)
