"""bigtrain's DPO against TRL's DPOTrainer on one CPU process: the same 8 pairs, model, tokenizer and beta give the same
steps (the loss and every rewards/* and logps/* TRL logs) within 1e-5. The first step alone would say little beyond the
log-probabilities (the policy is its reference: loss ln 2, rewards 0), so the second is compared too, after one AdamW
update that both make the same way (TRL's optimizer defaults: beta2 0.999, no weight decay, clip at 1; its schedule
set to constant).

TRL's settings that differ from bigtrain's defaults are set on TRL's side and named here: ``max_length`` (TRL's
default 1024) is the recipe's data.seq_len; dropout is off in both (TRL's ``disable_dropout``; the tiny Llama has
none); TRL's reference is its own frozen copy of the model (``ref_model=None`` with a full model), bigtrain's its
sharded copy (``parallel.reference: sharded``, the default for full fine-tuning). The global batch is the data set, so
TRL's shuffled sampler sees the same pairs in step 1.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import read_metrics, recipe_dict, save_tiny_model, write_recipe

from bigtrain.config.load import load_recipe
from bigtrain.data.tokenizer import save_byte_tokenizer
from bigtrain.losses.preference import SUMMED
from bigtrain.train.run import run_training

PAIRS = [
    {"prompt": f"Q{i}: {i}+{i}=", "chosen": f" {2 * i}", "rejected": f" {2 * i + 1} or so" * (1 + i % 2)}
    for i in range(8)
]
BETA, SEQ_LEN = 0.3, 48
LOGGED = (*SUMMED, "rewards/margins")  # every metric a step reports


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl_dpo")
    model_dir = save_tiny_model(root / "model", vocab_size=260)
    save_byte_tokenizer(model_dir)
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    return root, model_dir


def trl_steps(root, model_dir) -> list[dict]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    torch.manual_seed(0)
    args = DPOConfig(
        output_dir=str(root / "trl"),
        per_device_train_batch_size=len(PAIRS),
        max_steps=2,
        lr_scheduler_type="constant",
        logging_steps=1,
        learning_rate=1e-3,
        beta=BETA,
        max_length=SEQ_LEN,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(PAIRS), processing_class=tokenizer)
    trainer.train()
    return [entry for entry in trainer.state.log_history if "loss" in entry]


def test_dpo_steps_equal_trl_s(inputs):
    root, model_dir = inputs
    recipe = recipe_dict(
        root / "out",
        root / "pairs.jsonl",
        model_dir,
        data={"seq_len": SEQ_LEN, "shuffle": False},
        train={
            **{"steps": 2, "global_batch_size": len(PAIRS), "objective": "dpo", "beta": BETA},
            **{"lr": 1e-3, "lr_schedule": "constant", "adam_beta2": 0.999, "weight_decay": 0.0, "grad_clip": 1.0},
        },
        parallel={"backend": "ddp", "micro_batch_size": 4},
        checkpoint={"save_final_model": False},
    )
    run_training(load_recipe(write_recipe(root / "dpo.yaml", recipe)))
    ours = read_metrics(root / "out")
    theirs = trl_steps(root, model_dir)
    assert len(theirs) == len(ours) == 2
    assert theirs[0]["loss"] == pytest.approx(0.6931, abs=1e-3)  # step 1: the policy is the reference, loss ln 2
    assert theirs[1]["rewards/margins"] > 1e-3  # step 2: the reference and the policy differ
    for step, (mine, trl) in enumerate(zip(ours, theirs, strict=True), 1):
        for key in ("loss", *LOGGED):
            assert mine[key] == pytest.approx(trl[key], rel=1e-5, abs=1e-6), f"step {step} {key}"


@pytest.mark.full
def test_the_trl_dpo_route_runs_the_plan(inputs):
    """recipes/trl_dpo_train.py: bigtrain.plan's DPOConfig handed to TRL's DPOTrainer, LoRA with TRL's reference the
    adapter-disabled base (bigtrain's adapter_disabled), on 2 CPU processes."""
    from helpers import REPO, run_torchrun

    root, model_dir = inputs
    recipe = recipe_dict(
        root / "route_out",
        "builtin:preferences",
        model_dir,
        data={"seq_len": 512},
        train={"steps": 3, "global_batch_size": 4, "objective": "dpo", "method": "lora", "lr": 1e-2},
        parallel={"backend": "ddp", "micro_batch_size": 2},
    )
    path = write_recipe(root / "route.yaml", recipe)
    proc = run_torchrun([str(REPO / "recipes" / "trl_dpo_train.py"), str(path)], module=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trl dpo: 3 steps, loss 0.6931" in proc.stdout
    assert "reference=adapter_disabled" in proc.stdout
