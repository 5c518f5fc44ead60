"""An embedding run through the gradient cache with BERT's default dropout (0.1) on: stopped and resumed it equals the
run that never stopped, step for step (the two forwards of each micro-batch draw the same masks from the random state
the checkpoint restores); and DeepSpeed's engine equals the torch-native one on one rank (its forward with a graph
replays the masks of the pass before it: without that its gradient norm was 7% off at step 1)."""

from __future__ import annotations

import pytest
from helpers import read_metrics, recipe_dict, run_cli, write_recipe

from bigtrain.config.load import load_recipe
from bigtrain.train.run import run_training

BERT = {"model_type": "bert", "vocab_size": 320, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 128}  # fmt: skip


def _recipe(out, steps: int) -> dict:
    # 8 anchors a step in micro-batches of 2: the cache over 4 of them; a checkpoint every 3 steps
    train = {"steps": steps, "global_batch_size": 8, "lr": 1e-3, "lr_schedule": "constant", "eval_every": 0}
    recipe = recipe_dict(out, "builtin:retrieval", BERT, data={"seq_len": 48}, train=train,
                         parallel={"backend": "ddp", "micro_batch_size": 2},
                         checkpoint={"every": 3, "save_final_model": False})  # fmt: skip
    recipe["model"]["task"] = "embedding"
    return recipe


def test_a_resumed_embedding_run_equals_the_run_that_never_stopped(tmp_path):
    run_training(load_recipe(write_recipe(tmp_path / "straight.yaml", _recipe(tmp_path / "straight", 6))))
    whole = read_metrics(tmp_path / "straight")
    stopped = _recipe(tmp_path / "stopped", 3)
    run_training(load_recipe(write_recipe(tmp_path / "first.yaml", stopped)))
    stopped["train"]["steps"] = 6
    run_training(load_recipe(write_recipe(tmp_path / "second.yaml", stopped)))
    resumed = read_metrics(tmp_path / "stopped")
    assert [r["step"] for r in resumed] == list(range(1, 7))
    for mine, theirs in zip(resumed, whole, strict=True):
        for key in ("loss", "grad_norm", "accuracy"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-7), (mine["step"], key)


def test_deepspeed_replays_the_dropout_masks_as_the_torch_native_engine_does(tmp_path):
    runs = {}
    for backend, stage in (("ddp", 0), ("deepspeed", 2)):
        recipe = _recipe(tmp_path / backend, 3)
        recipe["parallel"] = {"backend": backend, "zero_stage": stage, "micro_batch_size": 2}
        proc = run_cli(["train", str(write_recipe(tmp_path / f"{backend}.yaml", recipe))])
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[backend] = read_metrics(tmp_path / backend)
    for mine, theirs in zip(runs["deepspeed"], runs["ddp"], strict=True):
        for key in ("loss", "grad_norm", "accuracy"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-6), (mine["step"], key)
