"""Replica groups that survive a failure (``parallel.replica_failures: continue``, torchft): a group killed with
kill -9 leaves the other training without a restart; its workers started again, it takes the healthy group's state
and rejoins; the run ends with both groups holding the same weights. Real jobs: ``bigtrain train --nproc 2`` starts
torchft's Lighthouse and one launcher per group (1 CPU rank each)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO, torchrun_command

pytestmark = pytest.mark.full

STEPS = 300


def group_workers(index: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        command = p.info["cmdline"] or []
        if "--quiet-failures" in command and "--replica-group" in command:  # a worker, not a group's launcher
            if command[command.index("--replica-group") + 1] == str(index):
                found.append(p)
    return found


def steps_of(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_killed_replica_group_leaves_the_other_training_and_rejoins_with_its_state(tmp_path):
    from safetensors.torch import load_file

    from bigtrain.checkpoint.export import export_model

    out = tmp_path / "out"
    command = [sys.executable, "-m", "bigtrain", "train", str(REPO / "recipes" / "diloco_quickstart.yaml"),
               "--nproc", "2", "--set", f"output_dir={out}", "--set", f"train.steps={STEPS}",
               "--set", "train.eval_every=0", "--set", "parallel.replica_failures=continue"]  # fmt: skip
    job = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(steps_of(out / "metrics.jsonl")) < 30:  # group 0 is training
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
            time.sleep(0.2)
        (victim,) = group_workers(1)
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = len(steps_of(out / "metrics.jsonl"))
        _, err = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0, err[-3000:]
    assert killed_at < STEPS - 50  # the kill landed mid-run
    assert steps_of(out / "metrics.jsonl") == list(range(1, STEPS + 1))  # group 0 trained on, never restarted
    assert err.count("bigtrain: plan ") == 1
    group1 = (out / "replica_groups" / "group1.log").read_text()
    assert group1.count("bigtrain: plan ") == 2  # its workers were started again
    took = [int(line.rsplit(" ", 1)[1]) for line in group1.splitlines() if "took a healthy group's state" in line]
    assert took and took[-1] > killed_at  # and it rejoined with group 0's step
    # every group ends with the same synchronised weights
    export_model(out / "replica_groups" / "group1" / "checkpoints" / f"step_{STEPS}", tmp_path / "group1")
    mine, theirs = (
        load_file(str(out / "model" / "model.safetensors")),
        load_file(str(tmp_path / "group1" / "model.safetensors")),
    )
    assert set(mine) == set(theirs)
    assert all((mine[k] == theirs[k]).all() for k in mine)


def test_replica_groups_started_by_torchrun_as_the_docs_say(tmp_path):
    """docs/slow-links.md's way on several machines: torchft's Lighthouse, and one torchrun per group with
    --replica-group I (here both on this machine); both groups end with the same weights."""
    from safetensors.torch import load_file
    from torchft._torchft import LighthouseServer

    from bigtrain.checkpoint.export import export_model

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=60_000)
    env = {**os.environ, "TORCHFT_LIGHTHOUSE": lighthouse.address(), "RUST_LOG": "warn", "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out"
    sets = ["--set", f"output_dir={out}", "--set", "train.steps=40", "--set", "parallel.replica_failures=continue"]
    jobs = [
        subprocess.Popen(
            torchrun_command(
                ["train", str(REPO / "recipes" / "diloco_quickstart.yaml"), *sets, "--replica-group", str(index)],
                nproc=1,
            ),  # fmt: skip
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        for index in range(2)
    ]
    try:
        results = [job.communicate(timeout=240) for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        lighthouse.shutdown()
    for job, (_, err) in zip(jobs, results, strict=True):
        assert job.returncode == 0, err[-3000:]
    assert steps_of(out / "metrics.jsonl") == list(range(1, 41))
    export_model(out / "replica_groups" / "group1" / "checkpoints" / "step_40", tmp_path / "group1")
    mine = load_file(str(out / "model" / "model.safetensors"))
    theirs = load_file(str(tmp_path / "group1" / "model.safetensors"))
    assert all((mine[k] == theirs[k]).all() for k in mine)
