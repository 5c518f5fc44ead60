"""bigtrain's reward model against TRL's RewardTrainer on one CPU process: the same 8 pairs (text, a margin on some),
model, tokenizer and center_rewards_coefficient give the same three steps (the loss, accuracy, margin and mean
reward TRL logs) within 1e-5, and the exported folder loads with ``AutoModelForSequenceClassification`` holding TRL's
trained weights (2e-5) and scoring texts as TRL's model does.

TRL's settings that differ from bigtrain's defaults are set on TRL's side and named here: its schedule set to
constant; its optimizer's beta2 0.999 set on bigtrain's (train.adam_beta2); ``max_length`` (TRL's 1024, where it drops
longer pairs) is above every pair here, as bigtrain's data.seq_len (where it cuts them). TRL pads with the tokenizer's
pad token (the byte tokenizer's is its end-of-text token), as bigtrain does. The global batch is the data set, so
TRL's shuffled sampler sees the same pairs in each step.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import read_metrics, recipe_dict, write_recipe

from bigtrain.config.load import load_recipe
from bigtrain.data.tokenizer import save_byte_tokenizer
from bigtrain.train.run import run_training

PAIRS = [
    {"prompt": f"Q{i}: {i}+{i}=", "chosen": f" {2 * i}", "rejected": f" {2 * i + 1} or so" * (1 + i % 2)}
    | ({"margin": 0.5 * (i % 3)} if i % 2 else {})
    for i in range(8)
]
SEQ_LEN, CENTER, STEPS = 48, 0.01, 3
LOGGED = ("accuracy", "margin", "mean_reward")


def save_reward_model(folder, vocab_size: int = 260):
    """A tiny Llama with a one-output score head (pad id 256: the byte tokenizer's end-of-text), saved."""
    from cases import TINY_LLAMA
    from transformers import AutoConfig, AutoModelForSequenceClassification

    spec = {**TINY_LLAMA, "vocab_size": vocab_size}
    config = AutoConfig.for_model(spec.pop("model_type"), **spec, num_labels=1, pad_token_id=256)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl_reward")
    model_dir = save_reward_model(root / "model")
    save_byte_tokenizer(model_dir)
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    return root, model_dir


def trl_steps(root, model_dir) -> tuple[list[dict], torch.nn.Module]:
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    torch.manual_seed(0)
    args = RewardConfig(
        output_dir=str(root / "trl"),
        per_device_train_batch_size=len(PAIRS),
        max_steps=STEPS,
        lr_scheduler_type="constant",
        logging_steps=1,
        learning_rate=1e-3,
        center_rewards_coefficient=CENTER,
        max_length=SEQ_LEN,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [{"margin": 0.0, **p} for p in PAIRS]  # TRL reads a margin column when the data has one: each row one
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train()
    return [entry for entry in trainer.state.log_history if "loss" in entry], trainer.model


def test_reward_model_steps_equal_trl_s_and_its_export_scores_the_same(inputs):
    root, model_dir = inputs
    recipe = recipe_dict(
        root / "out",
        root / "pairs.jsonl",
        model_dir,
        data={"seq_len": SEQ_LEN, "shuffle": False, "tokenizer": str(model_dir)},
        train={
            **{"steps": STEPS, "global_batch_size": len(PAIRS), "center_rewards_coefficient": CENTER},
            **{"lr": 1e-3, "lr_schedule": "constant", "adam_beta2": 0.999, "weight_decay": 0.0, "grad_clip": 1.0},
        },
        parallel={"backend": "ddp", "micro_batch_size": 4},
    )
    recipe["model"]["task"] = "reward-model"
    run_training(load_recipe(write_recipe(root / "reward.yaml", recipe)))
    ours = read_metrics(root / "out")
    theirs, trl_model = trl_steps(root, model_dir)
    assert len(theirs) == len(ours) == STEPS
    assert abs(theirs[-1]["margin"]) > 1e-3  # the steps moved the scores apart
    for step, (mine, trl) in enumerate(zip(ours, theirs, strict=True), 1):
        for key in ("loss", *LOGGED):
            assert mine[key] == pytest.approx(trl[key], rel=1e-5, abs=1e-6), f"step {step} {key}"

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    exported = AutoModelForSequenceClassification.from_pretrained(root / "out" / "model", dtype=torch.float32)
    assert exported.config.num_labels == 1 and exported.config.pad_token_id == 256
    trl_state = trl_model.state_dict()
    for name, value in exported.state_dict().items():  # the weights after the last step: TRL's
        torch.testing.assert_close(value, trl_state[name], rtol=0, atol=2e-5, msg=lambda m, k=name: f"{k}: {m}")
    tokenizer = AutoTokenizer.from_pretrained(root / "out" / "model")
    texts = [p["prompt"] + p[side] + tokenizer.eos_token for p in PAIRS for side in ("chosen", "rejected")]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():  # scored as a user scores with the folder: TRL's model's scores
        torch.testing.assert_close(exported(**batch).logits, trl_model.eval()(**batch).logits, rtol=0, atol=1e-4)
