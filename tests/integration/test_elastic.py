"""Elastic runs (``bigtrain train --nproc N --elastic``): a rank lost for good stops the job, which starts again on
the ranks that remain, re-planned, from the newest good checkpoint, and finishes; its steps after the loss equal a
run started from that checkpoint with the new plan written by hand, and every row of the epoch trains exactly once
across the loss (a per-row log: each rank's rows of each step, written by a test build of the loader)."""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest
from helpers import read_metrics, recipe_dict, run_cli, save_rows, write_recipe

# the test build: every worker (and the launcher) imports this first (PYTHONPATH), and each rank's loader appends the
# data rows it reads at each step to a file of its own
ROW_LOG = """
import json, os
_folder = os.environ.get("BIGTRAIN_TEST_ROW_LOG")
if _folder:
    from bigtrain.data import loader as _loader

    _read = _loader.StepLoader.host_step

    def _logged(self, step):
        index = self.order.micro_batches(step, self.dp_rank, self.dp_size, self.micro_batch_size)
        entry = {"step": step, "world": int(os.environ.get("WORLD_SIZE", "1")), "dp": [self.dp_rank, self.dp_size],
                 "rows": [int(r) for r in index.ravel()]}
        with open(os.path.join(_folder, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\\n")
        return _read(self, step)

    _loader.StepLoader.host_step = _logged
"""
STEPS, BATCH, CHECKPOINT_EVERY, LOST_AT = 28, 12, 8, 20
ROWS = STEPS * BATCH  # one epoch


def _recipe(tmp_path, out: str, **parallel) -> str:
    recipe = recipe_dict(
        tmp_path / out,
        tmp_path / "rows.npy",
        None,
        data={"shuffle": True},
        train={"steps": STEPS, "global_batch_size": BATCH, "lr": 3e-3, "mixed_precision": "fp32"},
        parallel=parallel,
        checkpoint={"every": CHECKPOINT_EVERY, "keep": 10, "save_final_model": False},
    )
    return str(write_recipe(tmp_path / f"{out}.yaml", recipe))


# the plan lost from: FSDP2 over 4 ranks with accumulation, or FSDP2 x tp=2 (the re-plan also drops tp)
FROM = {"fsdp2": dict(dp_shard=4), "fsdp2-tp2": dict(dp_shard=2, tp=2)}


@pytest.mark.full  # three launches of 3-4 ranks
@pytest.mark.parametrize("lost_from", list(FROM))
def test_a_rank_lost_for_good_is_replanned_on_the_rest_and_trains_as_the_new_plan_written_by_hand(
    tmp_path, monkeypatch, lost_from
):
    save_rows(tmp_path / "rows.npy", num_rows=ROWS, seq_len=17, learnable=True)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(ROW_LOG)
    (tmp_path / "rows_log").mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("BIGTRAIN_TEST_ROW_LOG", str(tmp_path / "rows_log"))

    # FSDP2 over 4 ranks with accumulation; rank 3 leaves for good before step 20
    elastic = _recipe(tmp_path, "elastic", backend="fsdp2", micro_batch_size=1, **FROM[lost_from])
    proc = run_cli(["train", elastic, "--nproc", "4", "--elastic", "--lose-rank", f"3@{LOST_AT}"], timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("bigtrain: elastic:")]
    resumed = CHECKPOINT_EVERY * ((LOST_AT - 1) // CHECKPOINT_EVERY)  # the newest checkpoint before the loss: 16
    assert len(said) == 2, proc.stderr[-3000:]
    assert said[0].startswith(
        f"bigtrain: elastic: lost rank 3 (device 3) for good; starting again on 3 rank(s), restart 1 of at most 3 "
        f"(the last good checkpoint is {tmp_path / 'elastic' / 'checkpoints' / f'step_{resumed}'})"
    ), said[0]
    # the recipe's plan cannot run on 3 ranks: the planner chose DDP (a model this small) with the same batch
    dp, tp = (4, 1) if lost_from == "fsdp2" else (2, 2)
    assert said[1].startswith(f"bigtrain: elastic: 4 -> 3 rank(s): plan fsdp2 zero3 dp={dp} tp={tp} pp=1 ac=none mb=1")
    assert "-> ddp dp=3 tp=1 pp=1 ac=none mb=4 (" in said[1], said[1]
    lost = LOST_AT - 1 - resumed
    assert said[1].endswith("s") and f"resumed at step {resumed}, {lost} step(s) lost since that checkpoint" in said[1]
    metrics = read_metrics(tmp_path / "elastic")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))

    # every row of the epoch once: each step's rows as its last attempt read them (the steps after the checkpoint
    # were read by 4 ranks, lost, and read again by 3)
    read: dict[tuple[int, int], dict[int, list[int]]] = defaultdict(dict)  # (step, world) -> dp rank -> rows
    sizes: dict[tuple[int, int], int] = {}
    for log in (tmp_path / "rows_log").iterdir():
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            (dp_rank, dp_size), key = entry["dp"], (entry["step"], entry["world"])
            # ranks of one data-parallel rank (tensor-parallel peers) read the same rows
            assert read[key].setdefault(dp_rank, entry["rows"]) == entry["rows"], key
            sizes[key] = dp_size
    rows = []
    for step in range(STEPS):
        key = (step, 3 if step >= resumed else 4)
        assert len(read[key]) == sizes[key], (key, sorted(read[key]))
        rows += [r for rank_rows in read[key].values() for r in rank_rows]
    assert sorted(rows) == list(range(ROWS))

    # the new plan written by hand, started from the same checkpoint
    monkeypatch.delenv("BIGTRAIN_TEST_ROW_LOG")
    by_hand = _recipe(tmp_path, "by_hand", backend="ddp", micro_batch_size=4)
    checkpoint = tmp_path / "elastic" / "checkpoints" / f"step_{resumed}"
    proc = run_cli(["train", by_hand, "--nproc", "3", "--set", f"checkpoint.resume={checkpoint}"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = read_metrics(tmp_path / "by_hand")
    assert [m["step"] for m in again] == list(range(resumed + 1, STEPS + 1))
    for mine, theirs in zip(metrics[resumed:], again, strict=True):
        assert abs(mine["loss"] - theirs["loss"]) <= 1e-5, (mine["step"], mine["loss"], theirs["loss"])


@pytest.mark.full
def test_a_world_no_plan_runs_on_stops_in_one_line_naming_the_ranks_that_would_with_the_checkpoint_kept(tmp_path):
    """16 rows a step cannot be split over 3 ranks: after the loss no plan runs, and the line names 2."""
    save_rows(tmp_path / "rows.npy", num_rows=256, seq_len=17)
    recipe = _recipe(tmp_path, "stuck", backend="fsdp2", dp_shard=4, micro_batch_size=1)
    sets = ["--set", "train.global_batch_size=16", "--set", "train.steps=8", "--set", "checkpoint.every=4"]
    proc = run_cli(["train", recipe, *sets, "--nproc", "4", "--elastic", "--lose-rank", "3@6"], timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    kept = tmp_path / "stuck" / "checkpoints" / "step_4"
    said = [line for line in proc.stderr.splitlines() if "no plan runs" in line]
    assert len(said) == 1 and said[0].startswith("bigtrain: error (rank 0/3): elastic: no plan runs on the 3 rank(s)")
    assert said[0].endswith(f"plans run on 2 of them: start again with 2 rank(s); the last good checkpoint is {kept}")
    assert (kept / "bigtrain.json").is_file() and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nproc", "2", "--lose-rank", "1@3"], "--lose-rank is a drill of an elastic run; add --elastic"),
        (["--elastic"], "--elastic starts again on the ranks that remain: give --nproc N, or run under torchrun"),
        (["--nproc", "2", "--elastic", "--min-nproc", "3"], "--min-nproc=3 must be between 1 and --nproc=2"),
        (["--nproc", "2", "--elastic", "--lose-rank", "2@3"], "--lose-rank=2@3: rank 2 is not one of --nproc=2's"),
        (["--nproc", "2", "--elastic", "--lose-rank", "1"], "--lose-rank='1' is not RANK@STEP (e.g. 3@20"),
        (["--nproc", "2", "--elastic", "--replica-group", "0"], "--replica-group 0 needs a written plan with "),
        (
            ["--nproc", "2", "--elastic", "--set", "parallel.replica_failures=continue"],
            "parallel.replica_failures=continue lets the other replica groups train on between synchronisations",
        ),
    ],
    ids=["drill-alone", "no-launcher", "min-nproc", "rank-outside", "no-step", "replica-group", "replica-failures"],
)
def test_elastic_flags_that_cannot_work_are_one_line(tmp_path, capfd, args, message):
    from bigtrain.cli import main

    save_rows(tmp_path / "rows.npy", num_rows=32, seq_len=17)
    recipe = _recipe(tmp_path, "flags", backend="fsdp2")
    assert main(["train", recipe, *args]) == 2
    err = capfd.readouterr().err
    assert message in err and "Traceback" not in err
