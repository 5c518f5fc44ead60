"""Mixed precision: bf16 tracks fp32, and fp16 loss scaling skips exactly an overflowing step and recovers.

These run the trainer in this process as a one-rank job (gloo), on the quickstart model and data.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import REPO, read_metrics

from bigtrain.config.load import load_recipe
from bigtrain.losses import CausalLM
from bigtrain.train.run import run_training

QUICKSTART = REPO / "recipes" / "quickstart.yaml"


# Short sequences and a small batch (256 tokens per step, accumulation 4): on a CPU without AVX-512, torch's bf16 and
# fp16 matmuls fall back to a reference kernel about 160x slower than fp32 (0.9 against 240 GFLOP/s measured with
# ONEDNN_MAX_CPU_ISA=AVX2), so these tests must not depend on their speed.
SMALL_STEPS = ["data.seq_len=32", "train.global_batch_size=8", "parallel.micro_batch_size=2"]


def quickstart(tmp_path, name, *overrides):
    cfg = load_recipe(QUICKSTART, ["train.steps=20", f"output_dir={tmp_path / name}", *SMALL_STEPS, *overrides])
    run_training(cfg)
    return read_metrics(tmp_path / name)


@pytest.mark.parametrize("backend", ["fsdp2", pytest.param("ddp", marks=pytest.mark.full)])  # full: the other engine
def test_bf16_stays_within_2_percent_of_fp32(tmp_path, backend):
    fp32 = quickstart(tmp_path, "fp32", f"parallel.backend={backend}", "parallel.zero_stage=null")
    bf16 = quickstart(
        tmp_path, "bf16", f"parallel.backend={backend}", "parallel.zero_stage=null", "train.mixed_precision=bf16"
    )
    assert fp32[-1]["loss"] < 0.7 * fp32[0]["loss"]  # it trains
    for a, b in zip(fp32, bf16, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=0.02), f"step {a['step']}"
    assert any(a["loss"] != b["loss"] for a, b in zip(fp32, bf16, strict=True))  # bf16 really ran


def test_fp16_overflow_skips_exactly_that_step_and_recovers(tmp_path, monkeypatch):
    overflow_step = 3
    real_loss = CausalLM.loss_sum
    calls = {"n": 0}
    accum = 4  # on one rank: global batch 8 = micro 2 x accum 4

    def loss_with_forced_overflow(self, logits, labels):
        calls["n"] += 1
        loss = real_loss(self, logits, labels)
        if (calls["n"] - 1) // accum + 1 == overflow_step:
            loss = loss * torch.tensor(float("inf"))
        return loss

    monkeypatch.setattr(CausalLM, "loss_sum", loss_with_forced_overflow)
    m = quickstart(tmp_path, "fp16", "train.mixed_precision=fp16", "train.steps=8")
    skipped = [r["step"] for r in m if r["skipped"]]
    assert skipped == [overflow_step]
    assert m[overflow_step]["loss_scale"] == m[overflow_step - 1]["loss_scale"] / 2  # halved after the overflow
    after = [r["loss"] for r in m[overflow_step:]]
    assert all(math.isfinite(x) for x in after)
    assert after[-1] < m[0]["loss"] * 0.9  # training continued and the loss kept falling
