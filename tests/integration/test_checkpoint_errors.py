"""A bad checkpoint or output_dir is one clear line naming the file, a non-zero exit on every rank, and no hang.

One 2-rank FSDP2 run makes the checkpoints; each test breaks a copy of one and resumes from it (or starts into a
run's output_dir it does not belong to).
"""

from __future__ import annotations

import shutil

import pytest
from helpers import recipe_dict, run_cli, run_torchrun, save_rows, save_tiny_model, write_recipe

EXIT_BAD_INPUT = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt-errors")
    spec = recipe_dict(
        root / "out",
        save_rows(root / "rows.npy", num_rows=16, learnable=True),
        save_tiny_model(root / "model"),
        train={"steps": 2, "global_batch_size": 4},
        checkpoint={"every": 1, "save_final_model": False},
    )
    path = write_recipe(root / "recipe.yaml", spec)
    proc = run_torchrun(["train", str(path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, path


def broken_copy(run, tmp_path):
    root, _ = run
    return shutil.copytree(root / "out" / "checkpoints" / "step_2", tmp_path / "step_2")


def resume_from(run, checkpoint, tmp_path, *more: str, nproc: int = 1):
    _, recipe = run
    args = ["train", str(recipe), "--set", f"checkpoint.resume={checkpoint}", "--set", f"output_dir={tmp_path / 'o'}"]
    args += ["--set", "train.steps=3", *more]  # one step past the checkpoint
    return run_torchrun(args, nproc=nproc, timeout=120) if nproc > 1 else run_cli(args, timeout=120)


def error_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("bigtrain: error")]


def test_a_missing_shard_is_named_on_every_rank(run, tmp_path):
    folder = broken_copy(run, tmp_path)
    (folder / "__1_0.distcp").unlink()
    proc = resume_from(run, folder, tmp_path, nproc=2)
    assert proc.returncode != 0
    lines = error_lines(proc)
    expected = f"checkpoint {folder} is damaged: {folder / '__1_0.distcp'} is missing"
    assert sorted(lines) == [f"bigtrain: error (rank {r}/2): {expected}" for r in (0, 1)], proc.stderr[-2000:]


@pytest.mark.full
def test_a_truncated_shard_is_named(run, tmp_path):
    folder = broken_copy(run, tmp_path)
    shard = folder / "__0_0.distcp"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size // 2)
    proc = resume_from(run, folder, tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT
    assert error_lines(proc) == [
        f"bigtrain: error: checkpoint {folder} is damaged: {shard} has {size // 2} bytes, {size} were written"
    ]


def test_a_shard_damaged_in_place_is_named(run, tmp_path):
    folder = broken_copy(run, tmp_path)
    shard = folder / "__0_0.distcp"
    with open(shard, "r+b") as f:
        f.write(b"\0" * 64)  # same size, so only reading it can tell
    proc = resume_from(run, folder, tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT
    (line,) = error_lines(proc)
    # caught by the checksum the save recorded, before any byte of it is read into the model
    assert line.startswith(
        f"bigtrain: error: checkpoint {folder} is damaged: {shard} does not match the checksum written at save"
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.full
def test_a_resume_path_that_does_not_exist(run, tmp_path):
    proc = resume_from(run, tmp_path / "nowhere", tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT
    assert error_lines(proc) == [f"bigtrain: error: checkpoint '{tmp_path / 'nowhere'}' does not exist"]


@pytest.mark.full
def test_a_checkpoint_of_another_model(run, tmp_path):
    root, _ = run
    other = save_tiny_model(tmp_path / "other", intermediate_size=96)
    checkpoint = root / "out" / "checkpoints" / "step_2"
    proc = resume_from(run, checkpoint, tmp_path, "--set", f"model.name_or_path={other}")
    assert proc.returncode == EXIT_BAD_INPUT
    (line,) = error_lines(proc)
    assert line.startswith(f"bigtrain: error: checkpoint {checkpoint} holds another model than the recipe's: ")
    assert "model.layers.0.mlp.gate_proj.weight has shape [128, 64], not [96, 64]" in line


@pytest.mark.full
def test_a_different_recipe_into_a_run_s_output_dir_is_refused_unless_asked(run, tmp_path):
    root, recipe = run
    out = shutil.copytree(root / "out", tmp_path / "out")
    args = ["train", str(recipe), "--set", f"output_dir={out}", "--set", "train.lr=0.1"]
    proc = run_cli(args, timeout=120)
    assert proc.returncode == EXIT_BAD_INPUT
    assert "holds a run with another recipe (train.lr: 0.0003 -> 0.1)" in error_lines(proc)[0]
    proc = run_cli(args + ["--set", "checkpoint.resume=false"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (aside,) = out.glob("replaced-*")
    assert (aside / "checkpoints" / "step_2").is_dir()  # the earlier run is kept, not deleted
    assert [line.count('"step"') for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 1]


@pytest.mark.full
def test_a_finished_run_started_again_says_so_and_exits_0(run):
    """Job schedulers re-queue and torchrun restarts on a non-zero exit: nothing is wrong, so exit 0, on every rank,
    starting no worker and changing nothing."""
    root, recipe = run
    before = (root / "out" / "metrics.jsonl").read_text()
    for proc in (run_torchrun(["train", str(recipe)], timeout=120), run_cli(["train", str(recipe), "--nproc", "2"])):
        assert proc.returncode == 0, proc.stderr[-2000:]
        said = [line for line in proc.stderr.splitlines() if line.startswith("bigtrain: the run is finished")]
        assert len(said) == 1 and "step_2 is at step 2 and train.steps=2" in said[0], proc.stderr[-2000:]
        assert "bigtrain: error" not in proc.stderr
    assert (root / "out" / "metrics.jsonl").read_text() == before
