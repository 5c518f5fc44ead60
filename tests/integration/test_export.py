"""``bigtrain export RECIPE --to accelerate|deepspeed|hf-trainer``: every recipe, each file read back by its own
library's parser, the HF Trainer route run for real, and the refusals."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, docs_commands, free_port, save_tiny_model

TARGETS = ("accelerate", "deepspeed", "hf-trainer")
RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))
# What a target cannot express, by (recipe, target): pipeline stages for all three, tp for a DeepSpeed JSON
REFUSED = {
    **{("pp_tp_fsdp", target): "parallel.pp=2 cannot be exported" for target in TARGETS},
    **{("long_context_8b_128k", target): "parallel.cp=2 cannot be exported" for target in TARGETS},
    ("tp_fsdp", "deepspeed"): "parallel.tp=2 cannot be exported",
}
# every task's plan exports (the classifiers', the vision-language model's and the diffusion transformer's recipes
# with the causal LMs'); these
# recipes' worlds are the --gpus given
CLASSIFIERS = ("image_classifier", "resnet50_imagefolder", "text_classifier", "vit_finetune", "vlm_lora")


def recipe_args(name: str, tmp_path: Path) -> tuple[list[str], int]:
    """Arguments that make the recipe exportable here, and the world size its plan gets."""
    if name == "pp_tp_fsdp":
        return [], 8  # its degrees state the world
    if name == "auto_quickstart":
        return ["--gpus", "2", "--gpu-memory", "80GB"], 2
    if name == "diloco_quickstart":  # its 2 replica groups of 1 rank state the world
        return ["--gpus", "2"], 2
    if name == "vit_finetune":  # its model is a folder this machine does not have: a config-only ViT in its place
        from transformers import ViTConfig

        folder = tmp_path / name
        ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64).save_pretrained(
            folder
        )
        return ["--gpus", "2", "--set", f"model.name_or_path={folder}"], 2
    if name == "vlm_lora":  # the walk-through's tiny model
        sys.path.insert(0, str(REPO / "recipes"))
        from make_vlm_demo import save_tiny_vlm

        return ["--gpus", "2", "--set", f"model.name_or_path={save_tiny_vlm(tmp_path / name)}"], 2
    if name == "flux_lora":  # the walk-through's tiny FLUX pipeline
        sys.path.insert(0, str(REPO / "recipes"))
        from make_flux_demo import pipeline_folder

        return ["--gpus", "2", "--set", f"model.name_or_path={pipeline_folder(tmp_path / name)}"], 2
    if name in CLASSIFIERS:  # the world their headers name
        return ["--gpus", "2"], 2
    if name == "sums_sft":  # one worker, as its header says
        return ["--gpus", "1"], 1
    if name in ("grpo_lora", "grpo_full"):  # the grpo walk-through's SFT model, on the 2 workers their headers name
        return ["--gpus", "2", "--set", f"model.name_or_path={save_tiny_model(tmp_path / name, vocab_size=260)}"], 2
    args = ["--gpus", "4"]
    if name == "qlora_70b_2x24gb":  # its model is a 70B folder this machine does not have; its plan states dp_shard=2
        return ["--set", f"model.name_or_path={save_tiny_model(tmp_path / name)}"], 2
    if name == "long_context_8b_128k":  # an 8B folder this machine does not have; dp_shard 4 x cp 2
        return ["--set", f"model.name_or_path={save_tiny_model(tmp_path / name)}"], 8
    if name in ("finetune_local", "chat_finetune", "lora_chat", "dpo_full", "dpo_lora"):  # the walk-throughs' folders
        args += ["--set", f"model.name_or_path={save_tiny_model(tmp_path / name)}"]
    if (
        name == "reward_model"
    ):  # the chat walk-through's SFT model, of 512 positions (its rows are checked against them)
        args += ["--set", f"model.name_or_path={save_tiny_model(tmp_path / name, max_position_embeddings=512)}"]
    return args, 4


def test_every_recipe_exports_to_each_target_or_names_what_it_cannot(cli_in_process, tmp_path):
    written: dict[tuple[str, str], tuple[Path, int]] = {}
    for name in RECIPES:
        args, world = recipe_args(name, tmp_path)
        for target in TARGETS:
            out = tmp_path / f"{name}.{target}"
            proc = cli_in_process(["export", f"recipes/{name}.yaml", "--to", target, "-o", str(out), *args])
            if (name, target) in REFUSED:
                assert proc.returncode == 2, proc.stderr
                assert REFUSED[name, target] in proc.stderr and "--to " + target in proc.stderr, proc.stderr
                assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
            else:
                assert proc.returncode == 0, proc.stderr
                written[name, target] = out, world
    assert len(written) == len(RECIPES) * len(TARGETS) - len(REFUSED)

    items = [f"{target}:{world}:{path}" for (_, target), (path, world) in written.items()]
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests/integration/load_exports.py"), *items],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"file"')]  # (DeepSpeed prints too)
    read = {Path(r["file"]).name: r["read"] for r in map(json.loads, lines)}
    assert len(read) == len(written)

    # what the libraries read is the plan: quickstart is FSDP2 zero_stage 3, micro-batch 4 on 4 ranks
    acc = read["quickstart.accelerate"]
    assert acc["distributed_type"] == "DistributedType.FSDP" and acc["num_processes"] == 4
    assert acc["fsdp_config"]["fsdp_version"] == 2 and acc["fsdp_config"]["fsdp_reshard_after_forward"] is True
    assert acc["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert read["tp_fsdp.accelerate"]["parallelism_config"]["parallelism_config_tp_size"] == 2
    ds = read["quickstart.deepspeed"]
    assert (ds["world_size"], ds["train_batch_size"], ds["micro"], ds["accumulation"], ds["stage"]) == (4, 16, 4, 1, 3)
    zero3 = read["deepspeed_zero3.deepspeed"]
    assert (zero3["micro"], zero3["accumulation"], zero3["stage"]) == (2, 2, 3)
    assert read["deepspeed_zero3.accelerate"]["deepspeed_config"]["zero_stage"] == 3
    hf = read["deepspeed_zero3.hf-trainer"]
    assert (hf["per_device_train_batch_size"], hf["gradient_accumulation_steps"], hf["deepspeed_stage"]) == (2, 2, 3)
    fsdp = read["quickstart.hf-trainer"]
    assert fsdp["fsdp"] and fsdp["fsdp_plugin_args"]["fsdp_version"] == 2
    assert fsdp["fsdp_plugin_args"]["reshard_after_forward"] is True
    assert read["tp_fsdp.hf-trainer"]["tp_size"] == 2
    # the other tasks: BERT lists no block class of its own (_no_split_modules is empty): the blocks bigtrain shards
    text = read["text_classifier.hf-trainer"]["fsdp_plugin_args"]
    assert "BertLayer" in text["transformer_cls_names_to_wrap"].split(",")
    assert "global batch 32 images" in written["image_classifier", "accelerate"][0].read_text()
    assert read["vlm_lora.deepspeed"]["world_size"] == 2


def test_notes_say_what_a_translation_changes(cli_in_process, tmp_path):
    proc = cli_in_process(["export", "recipes/tp_fsdp.yaml", "--to", "accelerate", "-o", str(tmp_path / "a.yaml")])
    assert proc.returncode == 0, proc.stderr
    assert "parallel.sequence_parallel and parallel.loss_parallel have no accelerate key" in proc.stderr
    text = (tmp_path / "a.yaml").read_text()
    assert text.startswith("# accelerate launch --config_file") and "gradient accumulation 2" in text
    proc = cli_in_process(
        [
            "export",
            "recipes/quickstart.yaml",
            "--to",
            "deepspeed",
            "--gpus",
            "2",
            "-o",
            str(tmp_path / "d.json"),
            "--set",
            "parallel.zero_stage=2",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert "DeepSpeed ZeRO-2, which keeps whole parameters on every rank" in proc.stderr
    assert json.loads((tmp_path / "d.json").read_text())["zero_optimization"]["stage"] == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--to", "megatron"], "argument --to: invalid choice: 'megatron'"),
        (["--to", "deepspeed"], "give the job's size with --gpus N"),
        (["--to", "deepspeed", "--gpus", "3"], "is not a multiple of parallel.micro_batch_size=4"),
        (["--to", "accelerate", "--gpus", "4", "--gpus-per-node", "3"], "do not fill whole nodes of 3"),
        (["--to", "hf-trainer", "--gpus", "2", "--set", "parallel.offload_optimizer=true"], "needs backend deepspeed"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(cli_in_process, tmp_path, args, message):
    out = tmp_path / "out"
    proc = cli_in_process(["export", "recipes/quickstart.yaml", "-o", str(out), *args])
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr
    assert not out.exists()


def test_plan_auto_needs_the_gpus_it_is_planned_for(cli_in_process, tmp_path):
    proc = cli_in_process(["export", "recipes/auto_quickstart.yaml", "--to", "deepspeed", "-o", str(tmp_path / "x")])
    assert proc.returncode == 2 and "give --gpus N and --gpu NAME or --gpu-memory SIZE" in proc.stderr


@pytest.mark.full
def test_the_docs_export_commands_run_as_written(cli_in_process, tmp_path, monkeypatch):
    """docs/running.md's export commands (those that need no GPU), in a scratch folder holding recipes/: the exports,
    and accelerate launching the quickstart with the exported config (cut to two steps)."""
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    monkeypatch.chdir(tmp_path)
    commands = docs_commands("export")
    assert [c.split()[0] for c in commands] == ["bigtrain", "accelerate", "bigtrain", "bigtrain"]
    for command in commands:
        args = shlex.split(command)
        if args[0] == "bigtrain":
            proc = cli_in_process(args[1:])
        else:  # accelerate launch ... -m bigtrain train recipes/quickstart.yaml
            args = [shutil.which("accelerate"), *args[1:4], "--main_process_port", str(free_port()), *args[4:]]
            args += ["--set", "train.steps=2", "--set", f"output_dir={tmp_path / 'out'}"]
            env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home")}  # no accelerate config of this host
            proc = subprocess.run(args, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
    assert {p.name for p in tmp_path.iterdir()} >= {"accelerate.yaml", "ds_config.json", "trainer_args.json", "out"}
