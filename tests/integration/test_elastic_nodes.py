"""Nodes lost and gained under torchrun's elastic agents (``--nnodes 1:2``, bigtrain as the worker with
``--elastic``), two nodes of 2 ranks on one machine, as test_multi_node.py starts them:
- the second node is killed outright (its agent and workers, as a node that loses power) mid-run, and the first
  continues alone: its agent starts its workers again, they resume from the newest good checkpoint re-planned for 2
  ranks (one line), and the run finishes;
- a run started on one node grows when the second joins the rendezvous: the agents stop the workers (each
  checkpoints), and all four resume on the larger plan, whose steps equal a run of that plan started by hand from
  the same checkpoint.
The agents run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, as docs/running.md says for restarts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO, free_port, read_metrics, recipe_dict, run_torchrun, save_rows, write_recipe

pytestmark = pytest.mark.full

STEPS, KILL_AT = 40, 10


def _agent(recipe, port: int, log) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic-nodes",
        "--max-restarts", "3", "--rdzv-conf", "last_call_timeout=5", "--monitor-interval", "0.5",
        "-m", "bigtrain", "train", str(recipe), "--elastic",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # restarted workers read no stale address (pytorch#135712)
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)


def _last_step(out) -> int:
    try:
        return json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    except (OSError, IndexError, ValueError):
        return 0


def _recipe(tmp_path, out):
    return write_recipe(
        tmp_path / f"{out.name}.yaml",
        recipe_dict(
            out,
            save_rows(tmp_path / "rows.npy", num_rows=STEPS * 8, learnable=True),
            data={"shuffle": True},
            train={"steps": STEPS, "global_batch_size": 8, "lr": 3e-3, "mixed_precision": "fp32"},
            parallel={"backend": "fsdp2", "micro_batch_size": 1},
            checkpoint={"every": 4, "keep": 20, "save_final_model": False},
        ),
    )


def _wait_for_step(out, step: int, log) -> None:
    deadline = time.time() + 240
    while _last_step(out) < step and time.time() < deadline:
        time.sleep(0.1)
    assert _last_step(out) >= step, log.read_text()[-3000:]


def test_the_node_that_remains_continues_alone_re_planned(tmp_path):
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, out)
    port = free_port()
    with (tmp_path / "first.log").open("w") as first_log, (tmp_path / "second.log").open("w") as second_log:
        first = _agent(recipe, port, first_log)
        time.sleep(2)  # the first agent hosts the rendezvous (the one a real job's head node runs)
        second = _agent(recipe, port, second_log)
        try:
            _wait_for_step(out, KILL_AT, tmp_path / "first.log")
            node = [*psutil.Process(second.pid).children(recursive=True), psutil.Process(second.pid)]
            for process in node:  # the node's workers and agent at once, without a word: a node gone
                process.send_signal(signal.SIGKILL)
            assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
        finally:
            for agent in (first, second):
                if agent.poll() is None:
                    agent.kill()
    log = (tmp_path / "first.log").read_text()
    said = [line for line in log.splitlines() if line.startswith("bigtrain: elastic:")]
    assert len(said) == 1 and said[0].startswith("bigtrain: elastic: 4 -> 2 rank(s): plan fsdp2 zero3 dp=4"), said
    assert "-> fsdp2 zero3 dp=2" in said[0]
    assert [m["step"] for m in read_metrics(out)] == list(range(1, STEPS + 1))
    assert "bigtrain: done: " in log and "Traceback" not in log, log[-3000:]


def test_a_node_that_joins_grows_the_run_at_a_checkpoint_onto_the_larger_plan(tmp_path):
    out = tmp_path / "grown"
    recipe = _recipe(tmp_path, out)
    port = free_port()
    with (tmp_path / "first.log").open("w") as first_log, (tmp_path / "second.log").open("w") as second_log:
        first = _agent(recipe, port, first_log)  # alone: after last_call_timeout the rendezvous closes with 2 ranks
        try:
            _wait_for_step(out, KILL_AT, tmp_path / "first.log")
            second = _agent(recipe, port, second_log)
            assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
            assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()[-3000:]
        finally:
            for agent in (first, locals().get("second")):
                if agent is not None and agent.poll() is None:
                    agent.kill()
    log = (tmp_path / "first.log").read_text()
    said = [line for line in log.splitlines() if line.startswith("bigtrain: elastic:")]
    assert len(said) == 1 and said[0].startswith("bigtrain: elastic: 2 -> 4 rank(s): plan fsdp2 zero3 dp=2"), said
    assert "-> fsdp2 zero3 dp=4" in said[0] and "0 step(s) lost since that checkpoint" in said[0]
    at = int(re.search(r"resumed at step (\d+)", said[0]).group(1))
    grown = read_metrics(out)
    assert [m["step"] for m in grown] == list(range(1, STEPS + 1)) and KILL_AT <= at < STEPS

    # the grown plan written by hand (4 ranks on one node), from the checkpoint the growth resumed
    checkpoint = out / "checkpoints" / f"step_{at}"
    by_hand = _recipe(tmp_path, tmp_path / "by_hand")
    proc = run_torchrun(["train", str(by_hand), "--set", f"checkpoint.resume={checkpoint}"], nproc=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = read_metrics(tmp_path / "by_hand")
    assert [m["step"] for m in again] == list(range(at + 1, STEPS + 1))
    for mine, theirs in zip(grown[at:], again, strict=True):
        assert abs(mine["loss"] - theirs["loss"]) <= 1e-5, (mine["step"], mine["loss"], theirs["loss"])
