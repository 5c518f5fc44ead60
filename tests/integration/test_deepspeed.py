"""The DeepSpeed backend from the CLI: ZeRO-Offload trains the quickstart, a contradicting DeepSpeed JSON is one line
on every rank before anything starts, and the shipped recipe is valid."""

from __future__ import annotations

import json
import shlex

import pytest
from helpers import REPO, docs_commands, read_metrics, run_cli


@pytest.mark.full
def test_zero_offload_trains_the_quickstart(tmp_path):
    out = tmp_path / "out"
    overrides = [
        "parallel.backend=deepspeed",
        "parallel.zero_stage=2",
        "parallel.offload_optimizer=true",
        "train.steps=20",
        "checkpoint.every=0",
        f"output_dir={out}",
    ]
    args = ["train", str(REPO / "recipes" / "quickstart.yaml"), "--nproc", "2"]
    proc = run_cli([*args, *[a for o in overrides for a in ("--set", o)]], timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [r["loss"] for r in read_metrics(out)]
    assert len(losses) == 20 and losses[-1] < 0.7 * losses[0], losses
    assert (out / "model" / "model.safetensors").is_file()  # the final model of a ZeRO-Offload run


def test_a_deepspeed_json_that_contradicts_the_recipe_is_one_line(tmp_path):
    """Every rank refuses it; --nproc's launcher says it once (the lowest rank's line)."""
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"gradient_accumulation_steps": 3, "zero_optimization": {"stage": 2}}))
    overrides = [
        "parallel.backend=deepspeed",
        "parallel.zero_stage=2",
        f"parallel.deepspeed_config={ds}",
        f"output_dir={tmp_path / 'out'}",
    ]
    args = ["train", str(REPO / "recipes" / "deepspeed_zero3.yaml"), "--nproc", "2"]
    proc = run_cli([*args, *[a for o in overrides for a in ("--set", o)]], timeout=120)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "gradient_accumulation_steps=3" in line]
    assert len(lines) == 1 and lines[0].startswith("bigtrain: error (rank 0/2): "), proc.stderr[-2000:]
    assert all("the recipe and plan give 4" in line and "Traceback" not in proc.stderr for line in lines)
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


@pytest.mark.full  # the default tier runs ZeRO under torchrun (equivalence, resume)
def test_zero3_runs_in_one_process_without_a_launcher(tmp_path):
    """No torchrun, no --nproc: the process is the job's one rank (DeepSpeed needs LOCAL_RANK, which no launcher
    exported; it failed with a KeyError before)."""
    out = tmp_path / "out"
    args = ["train", str(REPO / "recipes" / "deepspeed_zero3.yaml"), "--set", "train.steps=2"]
    proc = run_cli([*args, "--set", f"output_dir={out}"], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out)] == [1, 2]


@pytest.mark.full
def test_the_docs_deepspeed_command_runs_as_written(tmp_path):
    """docs/running.md's DeepSpeed command (ZeRO-3 on 2 workers), cut to two steps into a scratch output_dir."""
    (command,) = docs_commands("deepspeed")
    out = tmp_path / "out"
    args = [*shlex.split(command)[1:], "--set", "train.steps=2", "--set", f"output_dir={out}"]
    proc = run_cli(args, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
