"""grpo runs as a user starts them: bad settings and bad reward functions refused in one line (before any process
group where the recipe shows it; on every rank together where a reward function fails during training); a run stopped
in the middle of a generation and resumed equals the run that never stopped."""

from __future__ import annotations

import json

import pytest
from helpers import (
    read_metrics,
    recipe_dict,
    run_cli,
    save_chat_tokenizer,
    save_reward_model,
    save_tiny_model,
    write_recipe,
)

from bigtrain.config.load import load_recipe
from bigtrain.errors import ConfigError
from bigtrain.runtime import LaunchEnv
from bigtrain.train.run import TrainingJob, run_training

PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
REWARDS = (
    "def first_digit(prompts, completions, completion_ids, answer, **kw):\n"
    "    return [float(c[:1] == a[:1]) + 0.01 * (ids[0] % 7) for c, a, ids in zip(completions, answer, completion_ids)]\n"
    "def chat_shaped(prompts, completions, completion_ids, answer, **kw):\n"
    "    assert all(p[-1]['role'] == 'user' and c[0]['role'] == 'assistant' for p, c in zip(prompts, completions))\n"
    "    return [float(c[0]['content'][:1] == a[:1]) for c, a in zip(completions, answer)]\n"
    "def fussy(prompts, completions, completion_ids, answer, **kw):\n"
    "    if any(a == '3' for a in answer):\n"
    "        raise KeyError('three')\n"
    "    return [0.0] * len(completions)\n"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("grpo_model") / "model", vocab_size=260)


@pytest.fixture
def where(tmp_path, monkeypatch):
    """A run's folder with its prompts and its reward module, the directory bigtrain starts in."""
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    (tmp_path / "run_rewards.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _recipe(where, model_dir, out: str = "out", **train) -> dict:
    return recipe_dict(
        where / out,
        where / "prompts.jsonl",
        model_dir,
        data={"shuffle": True},
        train={
            "objective": "grpo",
            "steps": 6,
            "global_batch_size": 8,
            "num_generations": 4,
            "num_iterations": 2,
            "max_completion_length": 6,
            "beta": 0.04,
            "lr": 3e-3,
            "lr_schedule": "constant",
            "reward_functions": ["run_rewards:first_digit"],
            **train,
        },
        parallel={"backend": "fsdp2", "micro_batch_size": 2},
        checkpoint={"every": 3, "save_final_model": False},
    )


def _refused(where, recipe: dict) -> str:
    env = LaunchEnv(rank=1, world_size=2, local_rank=1, local_world_size=2, launched=True)
    with pytest.raises(ConfigError) as e:  # the recipe as bigtrain train reads it, then a rank's start-up
        TrainingJob(load_recipe(write_recipe(where / "bad.yaml", recipe)), env)
    return str(e.value)


def _set(section: str, **values):
    return lambda r: r.setdefault(section, {}).update(values)


@pytest.mark.parametrize(
    "change, message",
    [
        (_set("train", num_generations=3), "train.num_generations=3 does not divide train.global_batch_size=8"),
        (_set("train", num_generations=1), "train.num_generations=1: a group needs at least 2 completions"),
        (_set("train", reward_functions=[]), "train.objective=grpo needs train.reward_functions"),
        (_set("train", reward_functions=["nowhere:f"]), "module 'nowhere' does not import"),
        (_set("train", reward_functions=["run_rewards:absent"]), "module 'run_rewards' has no 'absent'"),
        (_set("train", reward_weights=[1.0, 2.0]), "train.reward_weights has 2 values for 1 reward functions"),
        (_set("train", loss_type="sigmoid"), "train.loss_type=sigmoid is dpo's"),
        (_set("rollout", engine="vllm"), "rollout.engine=vllm: vLLM is not installed here"),
        (_set("rollout", **{"async": 1}), "rollout.async=1 (off-policy rollouts) is not built yet"),
        (_set("parallel", tp=2), "parallel.tp=2 with train.objective=grpo is not built yet"),
        (_set("parallel", reference="precomputed"), "parallel.reference=precomputed with train.objective=grpo"),
        (_set("train", temperature=0.0), "train.temperature=0.0 must be above 0"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_settings_get_one_line(change, message, where, model_dir):
    recipe = _recipe(where, model_dir)
    change(recipe)
    assert message in _refused(where, recipe)


def test_a_reference_asked_without_a_kl_term_is_refused(where, model_dir):
    recipe = _recipe(where, model_dir, beta=0.0)
    recipe["parallel"]["reference"] = "sharded"
    assert "parallel.reference=sharded with train.beta=0: grpo then has no KL term" in _refused(where, recipe)


def test_prompts_without_a_prompt_field_are_named(where, model_dir):
    (where / "prompts.jsonl").write_text('{"question": "1+1="}\n')
    assert "record" in (message := _refused(where, _recipe(where, model_dir))) and "has no 'prompt' field" in message


@pytest.mark.parametrize(
    "parallel", [{"backend": "fsdp2"}, {"backend": "deepspeed", "zero_stage": 3}], ids=["fsdp2", "zero3"]
)
def test_a_reward_function_that_raises_stops_every_rank_with_its_line(where, model_dir, parallel):
    # beside a reward model sharded as the policy (FSDP2, or partitioned by ZeRO-3): every rank scores with it before
    # the function raises on one (in the other order, the ranks would meet in different collectives)
    folder = str(save_reward_model(where / "rm"))
    recipe = _recipe(where, model_dir, reward_functions=["run_rewards:fussy", folder], steps=8)
    recipe["parallel"].update(parallel)
    # in file order, generation 2 holds prompts 2 and 3: rank 1's, "0+3=", makes the function raise there only
    recipe["data"]["shuffle"] = False
    proc = run_cli(["train", str(write_recipe(where / "fussy.yaml", recipe)), "--nproc", "2"], cwd=where)
    assert proc.returncode != 0
    assert (
        "reward function run_rewards:fussy raised KeyError: 'three' on line 4 of data.path (a completion made for step 3)"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_chat_prompts_are_templated_and_their_completions_are_assistant_messages(where, model_dir):
    """Prompts as chat messages: rendered with the tokenizer's chat template and the assistant's opening, each
    completion handed to the reward function as TRL does, [{"role": "assistant", "content": text}]."""
    chats = [{"prompt": [{"role": "user", "content": p["prompt"]}], "answer": p["answer"]} for p in PROMPTS]
    (where / "prompts.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    recipe = _recipe(where, model_dir, reward_functions=["run_rewards:chat_shaped"], steps=2, beta=0.0)
    recipe["data"]["tokenizer"] = str(save_chat_tokenizer(where / "tokenizer"))
    run_training(load_recipe(write_recipe(where / "chat.yaml", recipe)))
    got = read_metrics(where / "out")
    assert [r["step"] for r in got] == [1, 2] and "rewards/chat_shaped/mean" in got[0]


@pytest.mark.full  # three runs
def test_a_run_resumed_inside_a_generation_equals_the_run_that_never_stopped(where, model_dir):
    straight = _recipe(where, model_dir, "straight")
    run_training(load_recipe(write_recipe(where / "straight.yaml", straight)))
    whole = read_metrics(straight["output_dir"])
    stopped = _recipe(where, model_dir, "stopped")
    stopped["train"]["steps"] = 3  # its checkpoint at step 3 is inside generation 2 (steps 3 and 4)
    run_training(load_recipe(write_recipe(where / "first.yaml", stopped)))
    stopped["train"]["steps"] = 6
    run_training(load_recipe(write_recipe(where / "second.yaml", stopped)))
    resumed = read_metrics(stopped["output_dir"])
    assert [r["step"] for r in resumed] == list(range(1, 7))
    for mine, theirs in zip(resumed, whole, strict=True):
        for key in ("loss", "grad_norm", "reward", "kl", "completions/mean_length"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-7), (mine["step"], key)
    assert len({r["reward"] for r in whole}) > 1  # the generations differ
