"""``bigtrain plan`` of a reward model: ``objective="reward"`` on a causal LM's preset plans its one-output
classifier (the objective names its task), a pair counted as two answers in the throughput and the scaling view."""

from __future__ import annotations

import pytest

import bigtrain


@pytest.mark.full  # the 8B's statistics measured on fake tensors at 2048 tokens: ~15 s on 2 cores
def test_the_reward_objective_plans_a_reward_model_of_a_causal_lm_preset():
    result = bigtrain.plan("llama-3-8b", gpus=8, gpu="H100", objective="reward", seq_len=2048, global_batch_size=64)
    assert result.request.job.task.name == "reward-model"
    table = result.explain()
    assert "global batch 64 pairs (128 rows)" in table and "ans/s/dev" in table
    assert "scaling of this plan, 16 answers per GPU per step" in table
    assert result.plan.backend in ("fsdp2", "deepspeed", "ddp") and result.plan.tp == result.plan.pp == 1
