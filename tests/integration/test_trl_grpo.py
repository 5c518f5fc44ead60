"""bigtrain's grpo against TRL's GRPOTrainer on one CPU process, on the same completions: TRL generates nothing here,
its ``rollout_func`` hands it the rollout replay bigtrain reads (``rollout.replay``), so both score, weigh and train
on the same 8 completions of the same 2 prompts with the same two reward functions (one leaves some completions
unscored). Step 1 (the loss TRL logs, its reward and the weights after the step) equal within 1e-5, for each
loss_type TRL and bigtrain share, with the KL term on (beta > 0: TRL's reference copy, bigtrain's frozen one).

TRL's settings that differ from bigtrain's defaults are set on TRL's side and named here: its schedule set to
constant, its optimizer's beta2 (0.999) and weight decay written into bigtrain's recipe, its ``max_grad_norm`` as
``train.grad_clip``; the global batch is the whole generation (TRL's per-device batch of 8, no accumulation).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import read_metrics, recipe_dict, save_tiny_model, write_recipe

from bigtrain.config.load import load_recipe
from bigtrain.data.tokenizer import save_byte_tokenizer
from bigtrain.train.run import TrainingJob

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))  # grpo_rewards, the launches' too

PROMPTS = [{"prompt": "12+7=", "answer": "19"}, {"prompt": "3+30=", "answer": "33"}]
GENERATIONS, EOS, MAX_COMPLETION, TEMPERATURE, BETA, LR, CLIP = 4, 256, 10, 0.9, 0.04, 1e-3, 1.0
REWARDS = ["grpo_rewards:answer_match", "grpo_rewards:shorter_text"]
WEIGHTS = [1.0, 0.5]


def completions() -> list[list[int]]:
    """8 completions, prompt 0's four then prompt 1's: random bytes, some ending with EOS, some cut at the limit."""
    rng = np.random.default_rng(5)
    out = []
    for i in range(len(PROMPTS) * GENERATIONS):
        ids = rng.integers(0, 256, size=int(rng.integers(2, MAX_COMPLETION + 1))).tolist()
        out.append(ids[: MAX_COMPLETION - 1] + [EOS] if i % 2 else ids)
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl_grpo")
    model_dir = save_tiny_model(root / "model", seed=2, vocab_size=260, tie_word_embeddings=False)
    save_byte_tokenizer(model_dir)
    (root / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    (root / "replay.jsonl").write_text(json.dumps({"completion_ids": completions()}) + "\n")
    save_reward_model(root / "scorer")
    return root, model_dir


def save_reward_model(folder):
    """A tiny one-output Llama classifier with the byte tokenizer: a reward-model folder."""
    from cases import TINY_LLAMA
    from transformers import AutoConfig, AutoModelForSequenceClassification

    spec = {**TINY_LLAMA, "vocab_size": 260}
    config = AutoConfig.for_model(spec.pop("model_type"), **spec, num_labels=1, pad_token_id=EOS)
    torch.manual_seed(4)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    save_byte_tokenizer(folder)
    return folder


def trl_step(root, model_dir, loss_type: str, scorer: bool = False) -> tuple[dict, torch.nn.Module]:
    import grpo_rewards
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    replayed = completions()

    def rollout_func(prompts, trainer):
        """The replay's completions, one per prompt TRL's sampler hands over (each prompt num_generations times in
        a row, in its own order): the n-th time a prompt comes, its n-th completion."""
        prompt_ids, completion_ids, seen = [], [], [0] * len(PROMPTS)
        for prompt in prompts:
            k = [p["prompt"] for p in PROMPTS].index(prompt)
            prompt_ids.append(list(prompt.encode()))
            completion_ids.append(replayed[k * GENERATIONS + seen[k]])
            seen[k] += 1
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": [[0.0] * len(c) for c in completion_ids]}  # fmt: skip

    args = GRPOConfig(
        output_dir=str(root / f"trl-{loss_type}-{scorer}"),
        per_device_train_batch_size=len(PROMPTS) * GENERATIONS,
        num_generations=GENERATIONS,
        max_completion_length=MAX_COMPLETION,
        max_steps=1,
        learning_rate=LR,
        lr_scheduler_type="constant",
        max_grad_norm=CLIP,
        beta=BETA,
        loss_type=loss_type,
        temperature=TEMPERATURE,
        reward_weights=WEIGHTS,
        logging_steps=1,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[str(root / "scorer") if scorer else grpo_rewards.answer_match, grpo_rewards.shorter_text],
        args=args,
        train_dataset=Dataset.from_list(PROMPTS),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    trainer.train()
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    return logged, trainer.model


@pytest.mark.parametrize(
    "loss_type, scorer",
    [
        ("dapo", False),
        pytest.param("grpo", False, marks=pytest.mark.full),
        pytest.param("dapo", True, marks=pytest.mark.full),
    ],
    ids=["dapo", "grpo", "reward-model"],
)
def test_grpo_step_equals_trl_s_on_the_same_completions(loss_type, scorer, inputs, monkeypatch):
    """``reward-model``: a reward model's folder in place of the first function (TRL loads it from the path too)."""
    root, model_dir = inputs
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func's notice: TRL's own switch for it
    recipe = recipe_dict(
        root / f"out-{loss_type}-{scorer}",
        root / "prompts.jsonl",
        model_dir,
        data={"shuffle": False, "tokenizer": str(model_dir)},
        train={
            **{"steps": 1, "global_batch_size": len(PROMPTS) * GENERATIONS, "objective": "grpo"},
            **{"lr": LR, "lr_schedule": "constant", "adam_beta2": 0.999, "weight_decay": 0.0, "grad_clip": CLIP},
            **{"num_generations": GENERATIONS, "max_completion_length": MAX_COMPLETION, "beta": BETA},
            **{"temperature": TEMPERATURE, "loss_type": loss_type},
            "reward_functions": [str(root / "scorer"), REWARDS[1]] if scorer else REWARDS,
            "reward_weights": WEIGHTS,
        },
        parallel={"backend": "ddp", "micro_batch_size": 4},
        checkpoint={"save_final_model": False},
    )
    recipe["rollout"] = {"replay": str(root / "replay.jsonl")}
    ours, params = bigtrain_step(root, recipe, f"{loss_type}-{scorer}")
    theirs, trl_model = trl_step(root, model_dir, loss_type, scorer)
    # the step has something to compare (grpo's loss is 0 on its first step: each completion's ratio is 1 and the
    # advantages of a group sum to 0; its gradient is not)
    assert theirs["grad_norm"] > 1e-3 and (loss_type == "grpo" or abs(theirs["loss"]) > 1e-3)
    for key in ("loss", "grad_norm", "reward", "reward_std"):
        assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-6), key
    trl_state = trl_model.state_dict()
    for name, value in params.items():
        torch.testing.assert_close(value, trl_state[name], rtol=0, atol=1e-5, msg=lambda m, k=name: f"{k}: {m}")


def bigtrain_step(root, recipe: dict, name: str) -> tuple[dict, dict]:
    """bigtrain's first step: its metrics, and the weights after it."""
    cfg = load_recipe(write_recipe(root / f"grpo-{name}.yaml", recipe))
    with TrainingJob(cfg) as job:
        job.fit()
        state = {k: v.detach().clone() for k, v in job.engine.state_dict()["model"].items()}
    return read_metrics(root / f"out-{name}")[0], state
