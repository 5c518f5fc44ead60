"""Nothing is lost on a crash: a save killed half-way, a rank that dies, and preemption by SIGTERM.

Real 2-rank jobs under torchrun (gloo, fp32). The reference is one uninterrupted run; every interrupted run must
end with the same metrics, each step logged once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import (
    REPO,
    read_metrics,
    recipe_dict,
    run_torchrun,
    save_rows,
    save_tiny_model,
    torchrun_command,
    write_recipe,
)

FAULTS = REPO / "tests" / "integration" / "faults.py"
STEPS = 6


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash")
    return save_tiny_model(root / "model"), save_rows(root / "rows.npy", learnable=True)


def recipe(inputs, folder: Path, steps: int = STEPS, every: int = 2) -> Path:
    model_dir, rows = inputs
    return write_recipe(
        folder / "recipe.yaml",
        recipe_dict(
            folder / "out",
            rows,
            model_dir,
            train={"steps": steps, "global_batch_size": 4, "lr": 1e-2, "warmup_steps": 1, "weight_decay": 0.1},
            parallel={"backend": "fsdp2"},
            checkpoint={"every": every, "keep": 2},
        ),
    )


@pytest.fixture(scope="module")
def straight_run(inputs, tmp_path_factory) -> Path:
    """The folder of one uninterrupted run (its recipe and out/): the reference."""
    folder = tmp_path_factory.mktemp("straight")
    proc = run_torchrun(["train", str(recipe(inputs, folder))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def straight(straight_run):
    return read_metrics(straight_run / "out")


def assert_same_run(output_dir: Path, reference: list[dict]) -> None:
    got = read_metrics(output_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))  # every step once, none lost or repeated
    for mine, theirs in zip(got, reference, strict=True):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-6), mine["step"]
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-6), mine["step"]


def test_a_save_killed_half_way_leaves_the_previous_checkpoint_in_charge(inputs, straight, tmp_path):
    path = recipe(inputs, tmp_path)
    checkpoints = tmp_path / "out" / "checkpoints"
    killed = run_torchrun([str(FAULTS), "kill-before-publish", "4", "train", str(path)], module=False)
    assert killed.returncode != 0
    assert (checkpoints / ".step_4.partial").is_dir() and not (checkpoints / "step_4").exists()

    proc = run_torchrun(["train", str(path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {checkpoints / 'step_2'}" in proc.stderr
    assert not (checkpoints / ".step_4.partial").exists()  # the half-written save is cleared, never loaded
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_4", "step_6"]  # keep: 2
    assert_same_run(tmp_path / "out", straight)


def test_a_shard_damaged_in_place_is_named_and_the_previous_checkpoint_resumes(
    inputs, straight_run, straight, tmp_path
):
    """A shard of the newest checkpoint zeroed in place at the same size (what size checks cannot see): the next
    start names the file, resumes from the checkpoint before it, and ends as the uninterrupted run."""
    path = recipe(inputs, tmp_path)
    # a finished run of this recipe (output_dir is one of the keys a start may change), then damaged
    shutil.copytree(straight_run / "out", tmp_path / "out")
    checkpoints = tmp_path / "out" / "checkpoints"
    shard = sorted((checkpoints / f"step_{STEPS}").glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(4096)  # a tensor's bytes zeroed, the file's size unchanged
    shard.write_bytes(bytes(data))

    proc = run_torchrun(["train", str(path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        f"checkpoint {checkpoints / f'step_{STEPS}'} is damaged: {shard} does not match the checksum written at "
        "save" in proc.stderr
    )
    assert f"resuming from {checkpoints / f'step_{STEPS - 2}'}" in proc.stderr
    assert_same_run(tmp_path / "out", straight)


@pytest.mark.full
def test_torchrun_max_restarts_resumes_by_itself(inputs, straight, tmp_path):
    marker = tmp_path / "crashed-once"
    args = [str(FAULTS), "crash-once", str(marker), "train", str(recipe(inputs, tmp_path))]
    # torch's own workaround for torch issue #135712 (restarted workers can read the previous attempt's addresses
    # from the rendezvous store the launcher shares with them); the README says to set it with --max-restarts.
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    proc = run_torchrun(args, module=False, launcher_args=("--max-restarts", "1"), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists()  # the first attempt did crash
    assert f"resuming from {tmp_path / 'out' / 'checkpoints' / 'step_2'}" in proc.stderr
    assert_same_run(tmp_path / "out", straight)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)


def started_in_background(path: Path, out: Path, log) -> subprocess.Popen:
    """A 2-rank torchrun job of ``path`` writing its stderr to ``log``, returned once it has logged two steps."""
    job = subprocess.Popen(torchrun_command(["train", str(path)]), stdout=subprocess.DEVNULL, stderr=log, cwd=REPO)
    deadline = time.monotonic() + 120
    while not ((out / "metrics.jsonl").is_file() and len(read_metrics(out)) >= 2):
        if time.monotonic() > deadline or job.poll() is not None:
            job.kill()
            raise AssertionError("training did not start")
        time.sleep(0.2)
    return job


def test_sigterm_saves_at_the_step_boundary_exits_0_and_the_next_start_resumes(inputs, tmp_path):
    path = recipe(inputs, tmp_path, steps=100_000, every=0)
    out = tmp_path / "out"
    with open(tmp_path / "stderr.log", "w") as log:
        job = started_in_background(path, out, log)
        try:
            workers = _children(job.pid)
            assert len(workers) == 2
            os.kill(workers[-1], signal.SIGTERM)  # one rank only: all ranks must still stop after the same step
            assert job.wait(timeout=120) == 0, (tmp_path / "stderr.log").read_text()[-3000:]
        finally:
            job.kill()
    stopped_at = read_metrics(out)[-1]["step"]
    assert "SIGTERM: stopped after step" in (tmp_path / "stderr.log").read_text()
    assert (out / "checkpoints" / f"step_{stopped_at}" / "bigtrain.json").is_file()
    assert not (out / "model").exists()  # an interrupted run has no final model yet

    proc = run_torchrun(["train", str(path), "--set", f"train.steps={stopped_at + 2}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {out / 'checkpoints' / f'step_{stopped_at}'}" in proc.stderr
    assert [r["step"] for r in read_metrics(out)] == list(range(1, stopped_at + 3))
    assert (out / "model" / "model.safetensors").is_file()


@pytest.mark.full
def test_a_full_disk_during_a_save_is_one_line_and_the_last_good_checkpoint_resumes(inputs, straight, tmp_path):
    """The kernel's ENOSPC (each rank's data file of the step-4 save is /dev/full): every rank says which checkpoint
    failed, that the disk is full and which is the last good one; the partial folder is gone; the run resumes from
    the last good checkpoint and ends as the uninterrupted run."""
    path = recipe(inputs, tmp_path)
    checkpoints = tmp_path / "out" / "checkpoints"
    full = run_torchrun([str(FAULTS), "disk-full", "4", "train", str(path)], module=False)
    assert full.returncode != 0
    lines = [line for line in full.stderr.splitlines() if line.startswith("bigtrain: error")]
    expected = (
        f"the checkpoint of step 4 could not be written to {checkpoints / '.step_4.partial'}: no space left on "
        f"device; its partial folder is removed. The last good checkpoint is {checkpoints / 'step_2'}: free space "
        "and start again to resume from it"
    )
    assert sorted(lines) == [f"bigtrain: error (rank {r}/2): {expected}" for r in (0, 1)], full.stderr[-3000:]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_2"]

    proc = run_torchrun(["train", str(path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {checkpoints / 'step_2'}" in proc.stderr
    assert_same_run(tmp_path / "out", straight)


@pytest.mark.full
def test_a_second_start_into_a_running_run_s_output_dir_is_refused_and_touches_nothing(inputs, tmp_path):
    """Launched twice by mistake: the second start is one line per rank naming the first (its pid), exits non-zero,
    and the first trains on undisturbed: same outputs, nothing moved aside, and it finishes cleanly."""
    path = recipe(inputs, tmp_path, steps=100_000, every=0)
    out = tmp_path / "out"
    with open(tmp_path / "first.log", "w") as log:
        first = started_in_background(path, out, log)
        try:
            holder = json.loads((out / ".bigtrain.lock").read_text())
            second = run_torchrun(["train", str(path)], timeout=120)
            assert second.returncode != 0
            lines = [line for line in second.stderr.splitlines() if line.startswith("bigtrain: error")]
            assert len(lines) == 2 and all(
                f"output_dir {out} is in use by another run (pid {holder['pid']} on host" in line for line in lines
            ), second.stderr[-3000:]
            assert first.poll() is None  # still training
            os.kill(_children(first.pid)[0], signal.SIGTERM)
            assert first.wait(timeout=120) == 0, (tmp_path / "first.log").read_text()[-3000:]
        finally:
            first.kill()
    steps = [r["step"] for r in read_metrics(out)]
    assert steps == list(range(1, len(steps) + 1))  # one run's records, none lost or repeated
    assert not [p for p in out.iterdir() if p.name.startswith("replaced-")]  # nothing of the first moved aside
