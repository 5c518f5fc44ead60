"""Many nodes, on one machine: the command docs/running.md shows (its "two-nodes" block) started as two torchrun
agents, two nodes of 2 workers each meeting at a c10d rendezvous on 127.0.0.1. HSDP with dp_replicate = the nodes
logs the same losses as the same plan on one node of 4 ranks; every rank reads its node-local facts (LOCAL_RANK,
LOCAL_WORLD_SIZE; the planner's GPUs per node come from them); and the job's checkpoint resumes on one node."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import subprocess
import sys
import uuid

import pytest
from helpers import REPO, docs_commands, free_port, read_metrics, recipe_dict, run_torchrun, save_rows, write_recipe

pytestmark = pytest.mark.full  # the full tier; tests/tiers.py moves some beyond CI (docs/testing.md)

STEPS = 4


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes")
    recipe = recipe_dict(
        root / "two-nodes",
        save_rows(root / "rows.npy", learnable=True),
        train={"steps": STEPS, "global_batch_size": 8, "lr": 1e-2, "warmup_steps": 1},
        parallel={"backend": "fsdp2"},
        checkpoint={"every": 2, "save_final_model": False},
    )
    return root, write_recipe(root / "recipe.yaml", recipe)


def two_node_commands(recipe, facts) -> list[list[str]]:
    """The docs' command for node ranks 0 and 1, its variables filled for this machine, bigtrain's CLI behind the
    small launch_facts.py wrapper that records what each rank read of its launcher."""
    (command,) = docs_commands("two-nodes")
    port, job_id = free_port(), uuid.uuid4().hex[:8]
    out = []
    for node_rank in (0, 1):
        values = dict(NNODES="2", NODE_RANK=str(node_rank), GPUS_PER_NODE="2", JOB_ID=job_id, RECIPE=str(recipe))
        line = command.replace("$HEAD:29500", f"127.0.0.1:{port}")
        for name, value in values.items():
            line = line.replace(f"${name}", value)
        args = shlex.split(line)
        assert args[0] == "torchrun" and args[-4:-2] == ["train", str(recipe)], line
        module = args.index("-m")  # the same CLI, through the wrapper
        args = [sys.executable, "-m", "torch.distributed.run", *args[1:module]]
        out.append([*args, str(REPO / "tests/integration/launch_facts.py"), str(facts), *shlex.split(line)[module + 2 :]])
    return out


@pytest.fixture(scope="module")
def two_nodes(job):
    root, recipe = job
    facts = root / "facts"
    facts.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    agents = [
        subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for cmd in two_node_commands(recipe, facts)
    ]
    try:
        errors = [agent.communicate(timeout=240)[1] for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    assert all(agent.returncode == 0 for agent in agents), "\n".join(e[-2000:] for e in errors)
    return root / "two-nodes", facts, "\n".join(errors)


def test_hsdp_over_two_nodes_logs_what_one_node_logs(job, two_nodes):
    root, recipe = job
    out, _, log = two_nodes
    assert "4 rank(s) on cpu, 2 nodes x 2" in log
    plan = json.loads((out / "plan.json").read_text())
    assert (plan["dp_replicate"], plan["dp_shard"]) == (2, 2)
    one = root / "one-node"
    proc = run_torchrun(["train", str(recipe), "--set", "parallel.dp_replicate=2", "--set", f"output_dir={one}"], 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for mine, ref in zip(read_metrics(out), read_metrics(one), strict=True):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=1e-6), mine["step"]
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-6), mine["step"]


def test_every_rank_reads_its_node_local_facts(two_nodes):
    _, facts, _ = two_nodes
    seen = [json.loads((facts / f"rank_{rank}.json").read_text()) for rank in range(4)]
    assert [s["rank"] for s in seen] == [0, 1, 2, 3]
    assert all(s["world_size"] == 4 and s["local_world_size"] == 2 and s["launched"] for s in seen)
    assert sorted(s["local_rank"] for s in seen) == [0, 0, 1, 1]
    assert seen[0]["local_rank"] == 0 and seen[2]["local_rank"] == 0  # a node's workers are consecutive ranks


def test_the_planner_plans_two_nodes_from_the_launcher_s_facts(job, two_nodes, caplog):
    """plan: auto takes GPUs per node from LOCAL_WORLD_SIZE (what every rank read above): for rank 0 of that job the
    table it logs plans 4 ranks, 2 per node."""
    from bigtrain.config.load import load_recipe
    from bigtrain.runtime import LaunchEnv
    from bigtrain.train.run import TrainingJob

    root, recipe = job
    _, facts, _ = two_nodes
    env = LaunchEnv(**json.loads((facts / "rank_0.json").read_text()))
    cfg = load_recipe(recipe, ["parallel.plan=auto", f"output_dir={root / 'auto'}"])
    with caplog.at_level(logging.INFO, logger="bigtrain"):
        TrainingJob(cfg, env).dry_run()
    assert re.search(r"\| 4 x CPU \([0-9.]+ GiB each, 2 per node\) \|", caplog.text), caplog.text


def test_the_two_node_checkpoint_resumes_on_one_node(job, two_nodes):
    root, recipe = job
    out, _, _ = two_nodes
    resumed = root / "resumed"
    args = ["train", str(recipe), "--set", f"checkpoint.resume={out / 'checkpoints' / 'step_2'}"]
    proc = run_torchrun([*args, "--set", f"output_dir={resumed}", "--set", "parallel.dp_replicate=2"], nproc=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {out / 'checkpoints' / 'step_2'}" in proc.stderr
    got, ref = read_metrics(resumed), read_metrics(out)
    assert [r["step"] for r in got] == [3, 4]
    for mine, theirs in zip(got, ref[2:], strict=True):  # the same plan: exactly the two-node job's steps 3-4
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-6)
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-6)
