"""Resume is exact on the same plan and carries the model and optimizer to another world size or plan.

Real jobs (torchrun, gloo, fp32) of ``bigtrain train``: a straight run of 4 steps that checkpoints after step 2
(warmup + cosine, weight decay, clipping, 2 micro-steps of accumulation per rank) is the reference; a second job
resumes from its step-2 checkpoint into another output_dir and must log the same steps 3-4. The straight run also
ends with the final HF model, which the resumed run must reproduce.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import learnable_rows, read_metrics, run_torchrun, save_tiny_model, write_recipe

STEPS = 4
SAME_PLAN_RTOL = 1e-6  # resuming on the same plan continues exactly
RESHARD_RTOL = 1e-4  # another plan sums in another order: float noise only


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    np.save(root / "rows.npy", learnable_rows(32, 17))
    return save_tiny_model(root / "model"), root / "rows.npy"


def recipe(inputs, folder, backend: str) -> dict:
    model_dir, rows = inputs
    return {
        "model": {"name_or_path": str(model_dir)},
        "data": {"path": str(rows), "shuffle": True},
        "train": {
            "steps": STEPS,
            "global_batch_size": 8,
            "lr": 1e-2,
            "lr_schedule": "cosine",
            "warmup_steps": 2,
            "weight_decay": 0.1,
            "grad_clip": 0.5,
            "seed": 3,
        },
        "parallel": {"backend": backend, "micro_batch_size": 2},
        "checkpoint": {"every": 2, "keep": 5},
        "output_dir": str(folder / "out"),
    }


@pytest.fixture(scope="module")
def straight(inputs, tmp_path_factory):
    """The uninterrupted 2-rank run per backend (made on first use): its recipe file and output_dir."""
    runs = {}

    def get(backend: str):
        if backend not in runs:
            folder = tmp_path_factory.mktemp(f"straight-{backend}")
            path = write_recipe(folder / "recipe.yaml", recipe(inputs, folder, backend))
            proc = run_torchrun(["train", str(path)], nproc=2)
            assert proc.returncode == 0, proc.stderr[-3000:]
            runs[backend] = (path, folder / "out")
        return runs[backend]

    return get


def resume(recipe_path, checkpoint, output_dir, nproc: int, *overrides: str):
    args = ["train", str(recipe_path), "--set", f"checkpoint.resume={checkpoint}", "--set", f"output_dir={output_dir}"]
    for item in overrides:
        args += ["--set", item]
    proc = run_torchrun(args, nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def compare(resumed_dir, straight_dir, rtol: float) -> None:
    got, ref = read_metrics(resumed_dir), read_metrics(straight_dir)
    assert [r["step"] for r in got] == [3, 4]  # a new output_dir holds only the steps this start ran
    for mine, theirs in zip(got, ref[2:], strict=True):
        for key in ("loss", "grad_norm", "lr"):
            assert mine[key] == pytest.approx(theirs[key], rel=rtol), (mine["step"], key)


def final_weights(output_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(output_dir / "model" / "model.safetensors"))


@pytest.mark.parametrize("backend", ["fsdp2", "ddp"])
def test_resume_on_the_same_plan_continues_exactly(backend, straight, tmp_path):
    recipe_path, out = straight(backend)
    proc = resume(recipe_path, out / "checkpoints" / "step_2", tmp_path / "resumed", 2)
    assert f"resumed from {out / 'checkpoints' / 'step_2'}: step 2, saved by 2 rank(s)" in proc.stderr
    compare(tmp_path / "resumed", out, SAME_PLAN_RTOL)
    mine, theirs = final_weights(tmp_path / "resumed"), final_weights(out)
    assert set(mine) == set(theirs)
    for name, value in theirs.items():
        torch.testing.assert_close(mine[name], value, rtol=SAME_PLAN_RTOL, atol=1e-7, msg=name)


# nproc, parallel overrides: one rank, DDP, HSDP 2x2, tensor parallel 2
RESHARD = {
    "fsdp2-1rank": (1, []),
    "ddp-2ranks": (2, ["parallel.backend=ddp"]),
    "hsdp-2x2": (4, ["parallel.dp_replicate=2", "parallel.dp_shard=2", "parallel.micro_batch_size=1"]),
    "tp2": (2, ["parallel.tp=2"]),
}


@pytest.mark.parametrize("name", RESHARD)
def test_a_2rank_fsdp2_checkpoint_resumes_on_another_world_or_plan(name, straight, tmp_path):
    recipe_path, out = straight("fsdp2")
    nproc, overrides = RESHARD[name]
    proc = resume(recipe_path, out / "checkpoints" / "step_2", tmp_path / "resumed", nproc, *overrides)
    assert "saved by 2 rank(s) with plan" in proc.stderr
    compare(tmp_path / "resumed", out, RESHARD_RTOL)


def test_async_saves_hold_the_same_state(straight, tmp_path):
    """checkpoint.async writes in the background from a host copy taken at the step boundary: the later steps must
    not leak into it, so resuming from it continues exactly like resuming from a synchronous save."""
    recipe_path, out = straight("fsdp2")
    proc = run_torchrun(
        ["train", str(recipe_path), "--set", "checkpoint.async=true", "--set", f"output_dir={tmp_path / 'async'}"]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "async" / "checkpoints").iterdir()) == ["step_2", "step_4"]
    resume(recipe_path, tmp_path / "async" / "checkpoints" / "step_2", tmp_path / "resumed", 2)
    compare(tmp_path / "resumed", out, SAME_PLAN_RTOL)
