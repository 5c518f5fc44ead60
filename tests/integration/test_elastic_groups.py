"""Elastic replica groups (``bigtrain train --nproc N --elastic`` with ``parallel.replica_failures: continue``): a
group that cannot come back whole (its rank's device gone: ``--lose-rank``) leaves the others training (torchft);
the launcher then asks them to stop, they stop together after their next synchronisation with group 0's checkpoint,
and the run starts again as one group fewer with the same global batch. Its steps after that equal a run started
from that checkpoint with the fewer groups written by hand. Real jobs: 3 groups of 1 CPU rank, then 2."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest
from helpers import REPO, docs_commands

pytestmark = pytest.mark.full  # three launches of torchft groups (the launcher's stops: test_elastic_launch.py)

SYNC_EVERY, LOST_AT, STEPS = 5, 12, 30  # as docs/elastic.md's drill sets them


def _run(tmp_path, args: list[str]) -> subprocess.CompletedProcess:
    """``python -m bigtrain ARGS`` in ``tmp_path`` (the repository's recipes beside it), in a session of its own."""
    if not (tmp_path / "recipes").exists():
        (tmp_path / "recipes").symlink_to(REPO / "recipes")
    command = [sys.executable, "-m", "bigtrain", *args]
    job = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(command, job.returncode, stdout, stderr)


def _drill() -> tuple[list[str], dict[str, str]]:
    """docs/elastic.md's drill of replica groups: its words (``bigtrain`` dropped) and its ``--set`` keys."""
    (command,) = docs_commands("elastic-groups")
    words = shlex.split(command)
    assert words[:3] == ["bigtrain", "train", "recipes/diloco_quickstart.yaml"], words
    sets = dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--set")
    assert sets["parallel.sync_every"] == str(SYNC_EVERY) and sets["train.steps"] == str(STEPS)
    assert f"2@{LOST_AT}" in words
    return words[1:], sets


def _losses(out) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows}


def test_a_group_lost_for_good_leaves_the_others_going_on_as_fewer_groups_like_a_run_written_for_them(tmp_path):
    words, sets = _drill()
    run = _run(tmp_path, words)
    assert run.returncode == 0, run.stderr[-3000:]
    said = [line for line in run.stderr.splitlines() if line.startswith("bigtrain: elastic: ")]
    assert len(said) == 2, run.stderr[-3000:]
    assert said[0].startswith("bigtrain: elastic: replica group 2 (rank 2) cannot come back whole; the other groups ")
    assert "starting again as 2 group(s) of 1 rank(s), the global batch kept, restart 1 of at most 3" in said[0]
    # rank 0's line: the plans before and after, and where it resumed: right after a synchronisation
    assert "elastic: 3 -> 2 rank(s): plan ddp dp=3 " in said[1] and " -> ddp dp=2 " in said[1], said[1]
    stopped_at = int(said[1].split("resumed at step ")[1].split(",")[0])
    assert stopped_at > LOST_AT and stopped_at % SYNC_EVERY == 0, said[1]
    assert ", 0 step(s) lost since that checkpoint" in said[1]
    assert "Traceback" not in run.stderr and "GET /checkpoint" not in run.stderr  # torchft's HTTP log: quiet
    out = tmp_path / sets["output_dir"]
    group2 = (out / "replica_groups" / "group2.log").read_text()
    assert f"rank 0 leaves before step {LOST_AT}" in group2
    plan = json.loads((out / "plan.json").read_text())
    assert plan["dp_replicate"] == 2 and plan["micro_batch_size"] == 4  # 24 = 4 x 2 groups x accumulation 3
    elastic = _losses(out)
    assert sorted(elastic) == list(range(1, STEPS + 1))

    # by hand: the same checkpoint, the recipe written for 2 groups
    by_hand, checkpoint = tmp_path / "by_hand", out / "checkpoints" / f"step_{stopped_at}"
    sets.update({"parallel.dp_replicate": "2", "output_dir": str(by_hand), "checkpoint.resume": str(checkpoint)})
    again = _run(tmp_path, [*words[:2], "--nproc", "2", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]])
    assert again.returncode == 0, again.stderr[-3000:]
    written = _losses(by_hand)
    assert sorted(written) == list(range(stopped_at + 1, STEPS + 1))
    for step in written:
        assert abs(elastic[step] - written[step]) <= 1e-5, (step, elastic[step], written[step])
