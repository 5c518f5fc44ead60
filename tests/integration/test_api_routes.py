"""The three routes of docs/api.md on 2 CPU ranks: the HF Trainer, TRL's SFTTrainer (chat data, assistant-only loss)
and a plain accelerate loop, each configured by ``bigtrain.plan``, each training the same model as ``bigtrain
train`` on the same recipe (loss within 1e-4 step by step). DDP is what these tools run on CPUs; the plan is pinned
to ddp there (the planner chooses its own micro-batch and accumulation: the global batch and the loss
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

pytestmark = pytest.mark.slow
TOLERANCE = 1e-4
TRAIN = {"steps": 4, "global_batch_size": 8, "lr": 1e-2, "warmup_steps": 2, "mixed_precision": "fp32"}


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


def bigtrain_losses(run_dir: Path) -> list[float]:
    return [record["loss"] for record in read_metrics(run_dir) if "loss" in record]


def run_route(script: str, recipe: Path, out: Path) -> tuple[dict, str]:
    proc = run_torchrun([script, str(recipe), "--set", f"output_dir={out}"], nproc=2, module=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith('{"distributed_type"')][-1])
    assert "| 2 x CPU (" in proc.stdout  # bigtrain.plan planned for the job it runs in: 2 CPU processes
    return result, proc.stdout + proc.stderr


def assert_same_training(result: dict, expected: list[float]) -> None:
    assert result["world_size"] == 2 and result["distributed_type"] == "DistributedType.MULTI_CPU"
    assert result["plan"]["backend"] == "ddp" and result["plan"]["dp_replicate"] == 2
    assert len(result["losses"]) == len(expected) == TRAIN["steps"]
    worst = max(abs(a - b) for a, b in zip(result["losses"], expected, strict=True))
    assert worst < TOLERANCE, (result["losses"], expected)
    assert expected[-1] != expected[0]  # the steps trained something: later losses test the optimizer too


def assert_memory_line(result: dict, logs: str) -> None:
    line = result["memory_check"]
    assert line.startswith("bigtrain memory check: predicted peak ") and "(peak RSS)" in line
    assert line in logs  # logged by the run itself, not only returned


def test_hf_trainer_route_trains_what_bigtrain_trains(runs):
    result, logs = run_route("recipes/hf_trainer_train.py", runs["text"], runs["root"] / "hf_out")
    assert_same_training(result, bigtrain_losses(runs["root"] / "text_run"))
    assert_memory_line(result, logs)


def test_accelerate_loop_route_trains_what_bigtrain_trains(runs):
    result, logs = run_route("recipes/accelerate_train.py", runs["text"], runs["root"] / "acc_out")
    assert_same_training(result, bigtrain_losses(runs["root"] / "text_run"))
    assert_memory_line(result, logs)


def test_trl_sft_route_on_chat_data_trains_what_bigtrain_trains(runs):
    result, logs = run_route("recipes/trl_sft_train.py", runs["chat"], runs["root"] / "trl_out")
    assert_same_training(result, bigtrain_losses(runs["root"] / "chat_run"))
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
