"""Reward-model runs as a user starts them: bad settings and bad margins refused in one line before any process
group; a run stopped mid-way and resumed equals the run that never stopped; a causal LM's folder gets a new score
head, and ``train.objective: reward`` alone names the task."""

from __future__ import annotations

import json

import pytest
from helpers import read_metrics, recipe_dict, save_tiny_model, write_recipe

from bigtrain.config.load import load_recipe
from bigtrain.errors import ConfigError
from bigtrain.runtime import LaunchEnv
from bigtrain.train.run import TrainingJob, run_training

PAIRS = [
    {"prompt": f"{i} times 3 is ", "chosen": f"{3 * i}.", "rejected": f"{3 * i + 1 + i % 4}, or near it."}
    | ({"margin": 0.5} if i % 3 == 0 else {})
    for i in range(24)
]


def _write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("reward_model") / "model", vocab_size=260)  # a causal LM's folder


def _recipe(tmp_path, model_dir, data_path, task: str | None = "reward-model", **train) -> dict:
    recipe = recipe_dict(
        tmp_path / "out",
        data_path,
        model_dir,
        data={"seq_len": 40, "shuffle": True},
        train={"steps": 6, "global_batch_size": 4, "lr": 3e-3, "lr_schedule": "constant", **train},
        parallel={"backend": "fsdp2", "micro_batch_size": 2},
        checkpoint={"every": 3, "save_final_model": False},
    )
    if task is not None:
        recipe["model"]["task"] = task
    return recipe


def _refused(tmp_path, recipe: dict) -> str:
    env = LaunchEnv(rank=1, world_size=2, local_rank=1, local_world_size=2, launched=True)
    with pytest.raises(ConfigError) as e:  # the recipe as bigtrain train reads it, then a rank's start-up
        TrainingJob(load_recipe(write_recipe(tmp_path / "bad.yaml", recipe)), env)
    return str(e.value)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r["train"].update(center_rewards_coefficient=-0.1), "train.center_rewards_coefficient=-0.1 would"),
        (lambda r: r["train"].update(objective="dpo"), "which a reward-model model does not give"),
        (
            lambda r: r["model"].update(task="causal-lm") or r["train"].update(objective="reward"),
            "train.objective=reward scores each answer with a one-output head, which a causal-lm model does not have",
        ),
        (lambda r: r["parallel"].update(tp=2), "parallel.tp=2 with model.task=reward-model is not built yet"),
    ],
)
def test_bad_settings_get_one_line(change, message, tmp_path, model_dir):
    recipe = _recipe(tmp_path, model_dir, _write(tmp_path / "pairs.jsonl", PAIRS))
    change(recipe)
    assert message in _refused(tmp_path, recipe)


def test_a_margin_that_is_not_a_number_is_named_by_its_line(tmp_path, model_dir):
    path = _write(tmp_path / "pairs.jsonl", [PAIRS[0], PAIRS[1], {**PAIRS[2], "margin": "big"}])
    message = _refused(tmp_path, _recipe(tmp_path, model_dir, path))
    assert "line 3: 'margin' is 'big'; give a finite number" in message


@pytest.mark.full  # three runs
def test_a_resumed_run_equals_the_run_that_never_stopped(tmp_path, model_dir):
    data = _write(tmp_path / "pairs.jsonl", PAIRS)
    straight = _recipe(tmp_path / "straight", model_dir, data, task=None, objective="reward")  # names the task
    run_training(load_recipe(write_recipe(tmp_path / "straight.yaml", straight)))
    whole = read_metrics(straight["output_dir"])
    stopped = _recipe(tmp_path / "stopped", model_dir, data)
    stopped["train"]["steps"] = 3
    run_training(load_recipe(write_recipe(tmp_path / "first.yaml", stopped)))
    stopped["train"]["steps"] = 6
    run_training(load_recipe(write_recipe(tmp_path / "second.yaml", stopped)))
    resumed = read_metrics(stopped["output_dir"])
    assert [r["step"] for r in resumed] == list(range(1, 7))
    for mine, theirs in zip(resumed, whole, strict=True):
        for key in ("loss", "grad_norm", "accuracy", "margin"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-7), (mine["step"], key)
    assert whole[-1]["loss"] < whole[0]["loss"]  # the head learns to prefer
