"""``bigtrain train`` as a user runs it on one GPU (``--nproc 1``: torch's launcher, NCCL), each CUDA-only path of the
trainer: FSDP2 in bf16 with a checkpoint and a resume, DDP's bf16 autocast and fp16 loss scaling, FSDP2's fp16 loss
scaling, parameter offload to the host, torch.compile with full checkpointing, ``plan: auto`` on the detected GPU, and
the export of the trained checkpoint. What bench/gpu/cuda_paths.sh (now gone) ran and left to be read by eye, asserted (``-m gpu``)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import read_metrics, run_cli

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
QUICKSTART = "recipes/quickstart.yaml"

# name: (bigtrain train overrides, steps)
RUNS = {
    "ddp-bf16-autocast": (["train.mixed_precision=bf16", "parallel.backend=ddp", "parallel.zero_stage=0"], 30),
    "ddp-fp16-scaler": (["train.mixed_precision=fp16", "parallel.backend=ddp", "parallel.zero_stage=0"], 30),
    "fsdp2-fp16-scaler": (["train.mixed_precision=fp16"], 30),
    "fsdp2-offload-params": (["train.mixed_precision=bf16", "parallel.offload_params=true"], 30),
    "fsdp2-compile-ac-full": (
        ["train.mixed_precision=bf16", "train.compile=true", "parallel.activation_checkpointing=full"],
        30,
    ),
}


def _train(recipe: str, output_dir, steps: int, overrides: list[str]):
    sets = [x for o in [*overrides, f"train.steps={steps}", f"output_dir={output_dir}"] for x in ("--set", o)]
    proc = run_cli(["train", recipe, "--nproc", "1", *sets], timeout=400)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def _falls(metrics: list[dict]) -> None:
    assert all(m["loss"] == m["loss"] for m in metrics)  # no NaN
    assert metrics[-1]["loss"] < 0.8 * metrics[0]["loss"], (metrics[0]["loss"], metrics[-1]["loss"])
    assert metrics[-1]["peak_mem_bytes"] > 0  # torch.cuda.max_memory_allocated, not the host's RSS


@pytest.mark.parametrize("name", list(RUNS))
def test_a_cuda_path_trains(name, tmp_path):
    overrides, steps = RUNS[name]
    _train(QUICKSTART, tmp_path / name, steps, overrides)
    metrics = read_metrics(tmp_path / name)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    _falls(metrics)
    if "fp16" in name:
        assert all(m.get("loss_scale") for m in metrics), metrics[-1]  # dynamic loss scaling is on


def test_fsdp2_bf16_on_nccl_resumes_and_exports(tmp_path):
    out = tmp_path / "run"
    common = ["train.mixed_precision=bf16", "checkpoint.every=20"]
    _train(QUICKSTART, out, 40, common)
    proc = _train(QUICKSTART, out, 60, common)
    assert "resumed from" in proc.stdout + proc.stderr
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, 61))
    _falls(metrics)
    proc = run_cli(["export-model", str(out), "-o", str(tmp_path / "hf")], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").num_parameters() > 0


def test_plan_auto_trains_on_the_detected_gpu(tmp_path):
    _train("recipes/auto_quickstart.yaml", tmp_path / "auto", 30, [])
    plan = json.loads((tmp_path / "auto" / "plan.json").read_text())
    assert plan["backend"] in ("fsdp2", "ddp", "deepspeed"), plan
    _falls(read_metrics(tmp_path / "auto"))
