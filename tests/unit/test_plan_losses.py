"""bigtrain plan --losses: for each count of GPUs lost, the plan on the GPUs that remain with the global batch kept
(what an elastic run re-plans to), its step time and the throughput against all the GPUs; bad counts are one line."""

from __future__ import annotations

import pytest

import bigtrain
from bigtrain.cli import main
from bigtrain.planner.names import describe


def test_each_loss_is_the_plan_for_the_gpus_left_with_the_same_global_batch(capsys):
    assert main(["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "H100", "--losses", "4,1"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("after losing GPUs (--losses)") :].splitlines()
    rows = [line.split() for line in table if line.startswith("  ") and line.split()[0].isdigit()]
    assert [r[:3] for r in rows] == [["0", "8", "8"], ["1", "7", "7"], ["4", "4", "4"]]
    full = bigtrain.plan(model="llama-3-8b", gpus=8, gpu="H100")
    for row in rows[1:]:
        left = int(row[1])
        # planned here on its own: the full plan's global batch on the GPUs left (512 on 7, not 7's default 511)
        alone = bigtrain.plan(
            model="llama-3-8b", gpus=left, gpu="H100", global_batch_size=full.workload.global_batch_size
        )
        line = next(x for x in table if x.split()[:2] == row[:2])
        assert describe(alone.plan) in line and f"{alone.time.step_s:.3f}" in line
        assert f"{full.time.step_s / alone.time.step_s - 1:+.1%}" in line


def test_on_several_nodes_a_lost_gpu_takes_its_node(capsys):
    assert main(["plan", "--model", "llama-3-8b", "--gpus", "16", "--gpu", "H100", "--losses", "1"]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  1 (with its node)"))
    assert row.split()[4:6] == ["8", "8"]  # GPUs left, used


@pytest.mark.parametrize(
    "losses, message",
    [
        ("x", "--losses='x' is not a list of GPU counts lost, e.g. --losses 1,8"),
        ("8", "losing 8 of 8 GPUs leaves none"),
    ],
)
def test_bad_losses_are_one_line(capfd, losses, message):
    assert main(["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "H100", "--losses", losses]) == 2
    assert message in capfd.readouterr().err


def test_the_docs_command_runs_as_written(capsys):
    import shlex

    from helpers import docs_commands

    (command,) = docs_commands("plan-losses")
    assert main(shlex.split(command)[1:]) == 0
    assert "  1 (with its node)  56" in capsys.readouterr().out
