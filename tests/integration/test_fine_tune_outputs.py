"""What a fine-tuning run leaves for its user: held-out evaluation in metrics.jsonl, TensorBoard event files, and
``bigtrain report``'s plots."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import read_metrics, recipe_dict, run_cli, save_rows, write_recipe

from bigtrain.data.sources import TokenRows, hold_out
from bigtrain.errors import ConfigError


def test_hold_out_is_a_seeded_split_without_copies():
    rows = np.lib.format.open_memmap("/dev/shm/bigtrain-holdout.npy", mode="w+", dtype=np.int64, shape=(40, 4))
    rows[:] = np.arange(40)[:, None]
    data = TokenRows(rows, None, "rows")
    train, held = hold_out(data, 0.25, seed=3)
    assert train.num_rows == 30 and held.num_rows == 10
    assert sorted([*train.index, *held.index]) == list(range(40))  # a partition
    assert np.array_equal(held.index, hold_out(data, 0.25, seed=3)[1].index)  # the same for the same seed
    assert not np.array_equal(held.index, hold_out(data, 0.25, seed=4)[1].index)
    assert train.rows is rows  # the memory-mapped file is indexed, not copied
    batch = held.micro_batch(np.array([0, 1]))
    assert batch.input_ids[:, 0].tolist() == held.index[:2].tolist()
    with pytest.raises(ConfigError, match="leaves none to train on"):
        hold_out(TokenRows(rows[:1], None, "one"), 0.5, seed=0)


def test_eval_tensorboard_and_report(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    recipe = recipe_dict(
        out,
        save_rows(tmp_path / "rows.npy", num_rows=48, learnable=True),
        data={"eval_fraction": 0.25},
        train={"steps": 4, "global_batch_size": 8, "lr": 3e-3, "eval_every": 2, "log_to": "tensorboard"},
        parallel={"backend": "fsdp2"},
        checkpoint={"save_final_model": False},
    )
    proc = run_cli(["train", str(write_recipe(tmp_path / "r.yaml", recipe))], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eval: 12 held-out rows" in proc.stderr and "36 for training" in proc.stderr
    assert "eval_loss=" in proc.stderr  # the progress bar shows the latest evaluation
    metrics = read_metrics(out)
    evaluated = [r for r in metrics if "eval_loss" in r]
    assert [r["step"] for r in evaluated] == [2, 4]
    assert all(r["eval_tokens"] == 12 * 16 for r in evaluated)  # every held-out row, each predicting 16 tokens
    assert evaluated[1]["eval_loss"] < evaluated[0]["eval_loss"]  # the model learns the held-out rows' chain too
    assert evaluated[0]["eval_perplexity"] == pytest.approx(np.exp(evaluated[0]["eval_loss"]))

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/loss"} <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]
    assert [e.value for e in events.Scalars("eval/loss")] == pytest.approx([r["eval_loss"] for r in evaluated])

    proc = run_cli(["report", str(out)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not proc.stderr.strip(), proc.stderr  # nothing but the files written (matplotlib's font cache line filtered)
    written = proc.stdout.split()
    assert [p.rsplit("/", 1)[1] for p in written] == ["loss.png", "lr.png", "tokens_per_s.png", "memory.png"]
    import matplotlib.image

    for path in written:
        image = matplotlib.image.imread(path)
        assert image.shape[0] > 100 and image.shape[1] > 100  # a real picture, not an empty file
    proc = run_cli(["report", str(tmp_path)], timeout=60)
    assert proc.returncode == 2 and "has no metrics.jsonl" in proc.stderr
