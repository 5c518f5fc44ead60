"""``bigtrain probe`` measures this machine: matmul rates, copy bandwidth, and collectives over the launched ranks."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from helpers import REPO, docs_commands, run_cli

pytestmark = pytest.mark.full  # the full tier; tests/tiers.py moves some beyond CI (docs/testing.md)

def test_probe_over_two_ranks_writes_a_profile_the_planner_uses(tmp_path: Path, cli_in_process):
    out = tmp_path / "profile.json"
    proc = run_cli(["probe", "--nproc", "2", "-o", str(out)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    profile = json.loads(out.read_text())
    assert profile["device"].startswith("cpu")
    assert {m["dtype"] for m in profile["matmul"]} == {"bf16", "fp32"}
    assert all(m["tflops"] > 0 for m in profile["matmul"])
    assert profile["copy_gbps"] > 0
    assert profile["backend"] == "gloo"
    ops = {(c["op"], c["mib"]) for c in profile["collectives"] if c["ranks"] == 2 and c["bus_gbps"] > 0}
    assert ops == {(op, mib) for op in ("all_gather", "reduce_scatter", "all_reduce") for mib in (0.25, 1, 16)}
    assert all(c["seconds"] > 0 for c in profile["collectives"])
    # tp's DTensor machinery per block, on a fake two-rank group (measured 6-8 ms on the 2-core CI machine)
    assert set(profile["tp_block_overhead_s"]) == {"plain", "sequence_parallel"}
    assert all(0 < s < 1 for s in profile["tp_block_overhead_s"].values())
    # the host's seconds per forward of transformers' generate loop (grpo's rollouts): fixed, and per block
    assert 0 < profile["decode_step_s"]["fixed"] < 0.1 and 0 < profile["decode_step_s"]["per_block"] < 0.1
    # what a person reads: a summary table with units, then where the profile went
    assert "all_reduce over 2 ranks, 16 MiB" in proc.stdout and "TFLOP/s" in proc.stdout
    assert f"bigtrain: probe: profile written to {out}" in proc.stderr

    # the profile's measured rates set the planner's predicted times (the table's H100 otherwise)
    args = ["plan", "recipes/quickstart.yaml", "--gpus", "2", "--gpu-memory", "8GB", "--json"]
    plain = cli_in_process(args)
    probed = cli_in_process([*args, "--hardware-profile", str(out)])
    assert plain.returncode == probed.returncode == 0, probed.stderr
    step = {
        name: json.loads(p.stdout)["candidates"][0]["time"]["step_s"]
        for name, p in [("plain", plain), ("probed", probed)]
    }
    assert step["probed"] > 10 * step["plain"]  # a CPU is far slower than an H100


def test_probe_rejects_zero_ranks():
    proc = run_cli(["probe", "--nproc", "0"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "bigtrain: error: --nproc=0 must be at least 1"


def test_the_docs_probe_commands_run_as_written(tmp_path):
    """docs/planner.md's probe and plan-with-the-profile commands, in a scratch folder (the profile is written there)."""
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    for command in docs_commands("probe"):
        proc = run_cli(shlex.split(command)[1:], timeout=180, cwd=tmp_path)
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
    assert json.loads((tmp_path / "profile.json").read_text())["backend"] == "gloo"
