"""The three routes of docs/api.md on 2 CPU ranks: the HF Trainer, TRL's SFTTrainer (chat data, assistant-only loss)
and a plain accelerate loop, each configured by ``bigtrain.plan``, each training the same model as ``bigtrain
train`` on the same recipe: loss and gradient norm within 1e-4 on every step, final parameters within 2e-6 (mean), with
weight decay on (which the libraries apply to fewer parameters than bigtrain unless aligned) and clipping active.
A teeth case shows a route with its weight decay left off is caught. DDP is what these tools run on CPUs; the plan is
pinned to ddp there (the planner chooses its own micro-batch and accumulation: the global batch and the loss
normalisation make them equal). And every conversion built by its own library on a gloo group of the plan's size."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from helpers import (
    read_metrics,
    recipe_dict,
    run_torchrun,
    save_chat_tokenizer,
    save_rows,
    save_tiny_model,
    write_recipe,
)

pytestmark = pytest.mark.full  # the full tier; tests/tiers.py moves some beyond CI (docs/testing.md)

TOLERANCE = 1e-4  # loss and gradient norm, per step
# the final weights: the mean absolute difference over every element. Not the largest: Adam's first steps move a
# weight by lr * g / (|g| + eps), so one whose gradient is near eps moves by up to lr on float noise in g (measured
# here: largest 1.2e-4 after 4 steps at lr 1e-2 between two correct loops, in 0.04% of the elements; mean 2.7e-7)
PARAMETER_TOLERANCE = 2e-6
TRAIN = {
    "steps": 4,
    "global_batch_size": 8,
    "lr": 1e-2,
    "warmup_steps": 2,
    "mixed_precision": "fp32",
    "weight_decay": 0.1,
    "grad_clip": 0.5,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A text recipe and a chat recipe, each trained once by bigtrain train on 2 ranks (its plan: ddp, micro-batch
    2, accumulation 2)."""
    from bigtrain.data.builtin import builtin_records

    root = tmp_path_factory.mktemp("routes")
    model = save_tiny_model(root / "model")
    text = write_recipe(
        root / "text.yaml",
        recipe_dict(
            root / "text_run",
            save_rows(root / "rows.npy"),
            model,
            train=TRAIN,
            parallel={"backend": "ddp", "micro_batch_size": 2},
        ),
    )
    chat_model = save_chat_tokenizer(save_tiny_model(root / "chat_model", vocab_size=259))
    with open(root / "chat.jsonl", "w") as f:
        for record in itertools.islice(builtin_records("chat"), 40):
            f.write(json.dumps(record) + "\n")
    chat = write_recipe(
        root / "chat.yaml",
        recipe_dict(
            root / "chat_run",
            root / "chat.jsonl",
            chat_model,
            data={"seq_len": 384, "packing": "pad", "format": "chat"},
            train=TRAIN,
            parallel={"backend": "ddp", "micro_batch_size": 2},
        ),
    )
    for recipe in (text, chat):
        proc = run_torchrun(["train", str(recipe)], nproc=2, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return {"text": text, "chat": chat, "root": root}


def bigtrain_run(run_dir: Path) -> dict:
    metrics = [record for record in read_metrics(run_dir) if "loss" in record]
    return {
        "losses": [r["loss"] for r in metrics],
        "grad_norms": [r["grad_norm"] for r in metrics],
        "weights": str(run_dir / "model" / "model.safetensors"),
    }


TIED = {"model.embed_tokens.weight": "lm_head.weight", "lm_head.weight": "model.embed_tokens.weight"}


def mean_weight_difference(route: str, bigtrain: str) -> float:
    """Mean absolute difference over every element of bigtrain's final model (the route's file stores tied weights
    once, under either name)."""
    import torch
    from safetensors.torch import load_file

    mine, theirs = load_file(bigtrain), load_file(route)
    named = {k: k if k in theirs else TIED.get(k) for k in mine}
    assert all(v in theirs for v in named.values()), named
    return torch.cat([(mine[k] - theirs[v]).abs().flatten() for k, v in named.items()]).mean().item()


def run_route(script: str, recipe: Path, out: Path, *overrides: str) -> tuple[dict, str]:
    sets = [arg for o in (f"output_dir={out}", *overrides) for arg in ("--set", o)]
    proc = run_torchrun([script, str(recipe), *sets], nproc=2, module=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith('{"distributed_type"')][-1])
    assert "| 2 x CPU (" in proc.stdout  # bigtrain.plan planned for the job it runs in: 2 CPU processes
    return result, proc.stdout + proc.stderr


def training_differences(result: dict, expected: dict) -> tuple[float, float, float]:
    """(worst loss, worst gradient norm, mean final weight) differences between a route and bigtrain's run."""
    assert len(result["losses"]) == len(expected["losses"]) == TRAIN["steps"]
    assert len(result["grad_norms"]) == len(expected["grad_norms"]) == TRAIN["steps"]
    loss = max(abs(a - b) for a, b in zip(result["losses"], expected["losses"], strict=True))
    norm = max(abs(a - b) for a, b in zip(result["grad_norms"], expected["grad_norms"], strict=True))
    return loss, norm, mean_weight_difference(result["weights"], expected["weights"])


def assert_same_training(result: dict, expected: dict) -> None:
    assert result["world_size"] == 2 and result["distributed_type"] == "DistributedType.MULTI_CPU"
    assert result["plan"]["backend"] == "ddp" and result["plan"]["dp_replicate"] == 2
    loss, norm, weight = training_differences(result, expected)
    assert loss < TOLERANCE and norm < TOLERANCE, (result, expected)
    assert weight < PARAMETER_TOLERANCE, weight
    assert expected["losses"][-1] != expected["losses"][0]  # the steps trained: later losses test the optimizer too
    assert max(expected["grad_norms"]) > TRAIN["grad_clip"]  # clipping acted on a step


def assert_memory_line(result: dict, logs: str) -> None:
    line = result["memory_check"]
    assert line.startswith("bigtrain memory check: predicted peak ") and "(peak RSS)" in line
    assert line in logs  # logged by the run itself, not only returned


def test_hf_trainer_route_trains_what_bigtrain_trains(runs):
    result, logs = run_route("recipes/hf_trainer_train.py", runs["text"], runs["root"] / "hf_out")
    assert_same_training(result, bigtrain_run(runs["root"] / "text_run"))
    assert_memory_line(result, logs)


def test_accelerate_loop_route_trains_what_bigtrain_trains(runs):
    result, logs = run_route("recipes/accelerate_train.py", runs["text"], runs["root"] / "acc_out")
    assert_same_training(result, bigtrain_run(runs["root"] / "text_run"))
    assert_memory_line(result, logs)


def test_a_route_without_weight_decay_is_caught(runs):
    """Teeth: the accelerate loop with train.weight_decay=0 (what a library's default parameter groups do to the
    norms and biases, here to every weight) trains a model the comparison tells apart."""
    out = runs["root"] / "acc_no_decay"
    result, _ = run_route("recipes/accelerate_train.py", runs["text"], out, "train.weight_decay=0")
    loss, norm, weight = training_differences(result, bigtrain_run(runs["root"] / "text_run"))
    assert weight > 10 * PARAMETER_TOLERANCE, (loss, norm, weight)


def test_trl_sft_route_on_chat_data_trains_what_bigtrain_trains(runs):
    result, logs = run_route("recipes/trl_sft_train.py", runs["chat"], runs["root"] / "trl_out")
    assert_same_training(result, bigtrain_run(runs["root"] / "chat_run"))
    assert_memory_line(result, logs)


def test_every_conversion_is_built_by_its_library_on_a_group_of_the_plan_s_size():
    proc = run_torchrun(["tests/integration/api_objects.py"], nproc=2, module=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    read = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert len(read) == 5
    for name, r in read.items():
        plan, accum = r["plan"], r["accumulation"]
        assert accum * plan["micro_batch_size"] * 2 == 16, name
        trainer = r["trainer"]
        assert (trainer["per_device_train_batch_size"], trainer["gradient_accumulation_steps"]) == (2, accum), name
        assert trainer["world_size"] == 2 and trainer["bf16"] is True
        assert r["sft"] == {"max_length": 128, "per_device_train_batch_size": 2}
        acc = r["accelerate"]
        assert (acc["num_processes"], acc["gradient_accumulation_steps"], acc["mixed_precision"]) == (2, accum, "bf16")
        assert acc["distributed_type"] == "DistributedType.MULTI_CPU"  # what accelerate runs on CPUs
        if plan["backend"] == "fsdp2":
            assert trainer["fsdp"] and trainer["reshard_after_forward"] == (plan["zero_stage"] == 3)
            assert trainer["fsdp_activation_checkpointing"] == (plan["activation_checkpointing"] == "full")
            assert (acc["fsdp_version"], acc["fsdp_wrap"]) == (2, ["LlamaDecoderLayer"])
            assert acc["fsdp_reshard_after_forward"] == (plan["zero_stage"] == 3)
        elif plan["backend"] == "deepspeed":
            assert trainer["deepspeed_stage"] == acc["deepspeed_zero_stage"] == plan["zero_stage"]
            assert acc["deepspeed_offload_optimizer"] == ("cpu" if plan["offload_optimizer"] else "none")
            assert r["deepspeed"] == {"world_size": 2, "train_batch_size": 16, "stage": plan["zero_stage"]}
        else:
            assert not trainer["fsdp"] and trainer["deepspeed_stage"] is None and acc["fsdp_version"] is None
