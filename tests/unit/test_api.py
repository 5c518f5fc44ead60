"""``import bigtrain``: the public API (``bigtrain.plan``, ``recipe_plan``, ``PlanResult``, the memory check) against
the command line it shares its code path with, its errors, its conversions' plain values and the memory line."""

from __future__ import annotations

import inspect
import json
import sys
import typing
from pathlib import Path

import pytest
import torch
import yaml
from helpers import REPO, save_tiny_model

import bigtrain
from bigtrain.config.load import load_recipe
from bigtrain.config.resolve import resolve_plan
from bigtrain.errors import ConfigError
from bigtrain.planner.model_stats import load_model_config

RECIPES = sorted(p.name for p in (REPO / "recipes").glob("*.yaml"))
# the local folders the shipped recipes name, made here as config-only folders (planning reads config.json only)
RECIPE_FOLDERS = {
    "demo/base": None,
    "chat_demo/base": None,
    "chat_demo/run/model": None,  # the chat walk-through's SFT model, which the dpo recipes start from
    "sums_demo/sft/model": None,  # recipes/sums_sft.yaml's, which the grpo recipes start from
    "models/Meta-Llama-3-8B": "llama-3-8b",
    "models/Meta-Llama-3-70B": "llama-3-70b",
    "models/vit-base-patch16-224": "vit-base",
    "vlm_demo": "tiny-vlm",  # recipes/make_vlm_demo.py's
    "outputs/flux_demo": "tiny-flux",  # recipes/make_flux_demo.py's pipeline
}


@pytest.fixture
def recipe_world(tmp_path, monkeypatch):
    """A scratch folder holding recipes/ and the model folders the recipes name (relative paths resolve here)."""
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    for folder, preset in RECIPE_FOLDERS.items():
        if preset == "tiny-vlm":
            sys.path.insert(0, str(REPO / "recipes"))
            from make_vlm_demo import save_tiny_vlm

            save_tiny_vlm(tmp_path / folder)
        elif preset == "tiny-flux":
            sys.path.insert(0, str(REPO / "recipes"))
            from make_flux_demo import pipeline_folder

            pipeline_folder(tmp_path / folder)
        elif preset is None:  # the demos' models hold 512 positions (a reward model's rows are checked against them)
            save_tiny_model(tmp_path / folder, vocab_size=259, max_position_embeddings=512)
        else:
            (tmp_path / folder).mkdir(parents=True)
            (tmp_path / folder / "config.json").write_text(json.dumps(load_model_config(preset)))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_import_bigtrain_exposes_the_api_and_nothing_else():
    assert set(bigtrain.__all__) == {
        "ConfigError",
        "MemoryCheck",
        "MemoryCheckCallback",
        "PlanResult",
        "RankedPlan",
        "__version__",
        "check_memory",
        "plan",
        "recipe_plan",
    }
    from bigtrain import api

    assert set(bigtrain.__all__) - {"__version__"} == set(api.__all__)
    with pytest.raises(AttributeError, match="no attribute 'search'"):
        bigtrain.search  # noqa: B018 - the planner's internals stay internal
    for name in (n for n in bigtrain.__all__ if n != "__version__"):
        obj = getattr(bigtrain, name)
        assert inspect.getdoc(obj), f"bigtrain.{name} has no docstring"
    for fn in (bigtrain.plan, bigtrain.recipe_plan, bigtrain.check_memory):
        hints = typing.get_type_hints(fn)
        assert "return" in hints and all(p in hints for p in inspect.signature(fn).parameters), fn.__name__
    for name, method in inspect.getmembers(bigtrain.PlanResult, inspect.isfunction):
        if not name.startswith("_"):
            assert inspect.getdoc(method), f"PlanResult.{name} has no docstring"


# bigtrain plan calls bigtrain.plan: one recipe and one preset show the two stay one; every shipped recipe is planned
# once, in Python, below
@pytest.mark.parametrize("recipe, hardware", [("quickstart.yaml", ["--gpus", "2", "--gpu-memory", "24GB"])])
def test_a_recipe_plans_the_same_in_python_and_on_the_command_line(recipe, hardware, recipe_world, cli_in_process):
    proc = cli_in_process(["plan", f"recipes/{recipe}", *hardware, "--json"])
    assert proc.returncode in (0, 3), proc.stderr
    kwargs = {hardware[0][2:]: int(hardware[1]), hardware[2][2:].replace("-", "_"): hardware[3]}
    result = bigtrain.plan(recipe=f"recipes/{recipe}", **kwargs)
    assert json.loads(proc.stdout) == json.loads(json.dumps(result.to_dict()))
    assert (proc.returncode == 0) == result.fits


def test_every_shipped_recipe_plans_in_python(recipe_world):
    for recipe in RECIPES:
        result = bigtrain.plan(recipe=f"recipes/{recipe}", gpus=8, gpu="H100")
        assert result.to_dict()["candidates"], recipe


@pytest.mark.parametrize("preset, gpus", [("llama-3-70b", 8)])
def test_a_preset_plans_the_same_in_python_and_on_the_command_line(preset, gpus, cli_in_process):
    proc = cli_in_process(["plan", "--model", preset, "--gpus", str(gpus), "--gpu", "H100", "--json"])
    result = bigtrain.plan(preset, gpus=gpus, gpu="H100")
    assert json.loads(proc.stdout) == json.loads(json.dumps(result.to_dict()))
    assert proc.returncode == (0 if result.fits else 3)


def test_a_built_model_a_config_object_and_its_folder_plan_alike(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = save_tiny_model(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(folder)
    common = {"gpus": 2, "gpu_memory": "8GB", "seq_len": 64, "global_batch_size": 8}
    results = [
        bigtrain.plan(spec, **common)
        for spec in (folder, str(folder / "config.json"), AutoConfig.from_pretrained(folder), model)
    ]
    assert len({json.dumps(r.to_dict(), sort_keys=True) for r in results}) == 1
    assert results[0].to_recipe()["model"] == {"name_or_path": str(folder)}  # a folder stays a folder in the recipe
    assert results[3].to_recipe()["model"]["config"]["model_type"] == "llama"


def test_the_result_explains_ranks_and_says_why_each_candidate_lost():
    result = bigtrain.plan("llama-3-8b", gpus=8, gpu="H100", seq_len=4096, global_batch_size=64)
    assert result.fits and result.explain().splitlines()[0].startswith("model llama: 8.03B params")
    ranked = result.candidates(limit=5)
    assert ranked[0].plan == result.plan and ranked[0].why_not is None and ranked[0].fits
    fitting = [c for c in ranked[1:] if c.fits]
    assert fitting and all(c.why_not.startswith(("slower: ", "near tie")) for c in fitting)
    rejected = [c for c in ranked if not c.fits]
    assert rejected and all("GiB" in c.why_not or "crosses" in c.why_not for c in rejected)
    assert result.predicted_peak_bytes == result.memory.total_bytes
    assert result.gradient_accumulation_steps * result.micro_batch_size * result.plan.dp == 64


def test_nothing_fits_is_a_result_that_says_what_would():
    result = bigtrain.plan("llama-3-70b", gpus=1, gpu="L4", seq_len=4096, global_batch_size=8)
    assert not result.fits
    assert result.what_would_fit().startswith("Would fit with ")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gpus": 0, "gpu": "H100"}, "gpus=0 must be at least 1"),
        ({"gpus": 8, "gpu": "H100", "mixed_precision": "fp8"}, "mixed_precision='fp8' is not one of fp32, bf16, fp16"),
        ({"gpus": 8, "gpu": "H100", "seq_len": 1}, "seq_len=1 must be at least 2"),
        ({"gpus": 8, "gpu": "H100", "fix": {"bogus": 1}}, "fix['bogus']: unknown plan field; use one of backend,"),
        ({"gpus": 6, "gpus_per_node": 4, "gpu": "H100"}, "gpus=6 is not a whole number of nodes of gpus_per_node=4"),
        ({"gpus": 8, "gpu": "Z80"}, "gpu='Z80' is not a known GPU; use one of H100,"),
        ({"gpus": 8, "gpu_memory": "80"}, "gpu_memory='80' has no unit; write e.g. 80GB"),
        ({"gpus": "8", "gpu": "H100"}, "gpus='8' must be a whole number of GPUs"),
        ({"gpus": 8, "gpu": "H100", "compile": "yes"}, "compile='yes' is not one of true, false, auto"),
        (
            {"gpus": 8, "gpu": "H100", "fix": {"tp": 3}},
            "parallel.tp=3 x parallel.pp=1 = 3 does not divide the world size 8; use degrees whose product divides "
            "it (1, 2, 4, 8)",
        ),
    ],
)
def test_bad_input_names_the_argument_and_what_works(kwargs, message, cli_in_process):
    with pytest.raises(bigtrain.ConfigError) as e:
        bigtrain.plan("llama-3-8b", **kwargs)
    assert message in str(e.value)
    if "fix" in kwargs and "tp" in kwargs["fix"]:  # the same words as the command line (and the trainer)
        proc = cli_in_process(["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "H100", "--fix", "tp=3"])
        assert proc.stderr.strip() == f"bigtrain: error: {e.value}"


def test_a_model_that_is_none_of_the_forms_is_refused():
    with pytest.raises(bigtrain.ConfigError, match="model=object: pass a preset name"):
        bigtrain.plan(object(), gpus=2, gpu="H100")


def test_to_recipe_runs_the_same_plan(tmp_path):
    result = bigtrain.plan(
        "llama-3-8b", gpus=16, gpu="H100", seq_len=8192, global_batch_size=32, method="lora", fix={"micro_batch_size": 1}
    )
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(result.to_recipe()))
    cfg = load_recipe(path)
    assert resolve_plan(cfg.parallel, 16, cfg.train) == result.plan
    assert (cfg.train.method, cfg.data.seq_len, cfg.train.global_batch_size) == ("lora", 8192, 32)


def test_recipe_plan_is_the_plan_bigtrain_train_runs():
    written = bigtrain.recipe_plan(REPO / "recipes/deepspeed_zero3.yaml", gpus=4)
    cfg = load_recipe(REPO / "recipes/deepspeed_zero3.yaml")
    assert written.plan == resolve_plan(cfg.parallel, 4, cfg.train) and written.candidates()[0].why_not is None
    assert written.memory.total_bytes > 0 and written.time.step_s > 0
    auto = bigtrain.recipe_plan(REPO / "recipes/auto_quickstart.yaml", gpus=2, gpu_memory="80GB")
    assert auto.plan == bigtrain.plan(recipe=REPO / "recipes/auto_quickstart.yaml", gpus=2, gpu_memory="80GB").plan


def test_conversions_carry_the_plan():
    result = bigtrain.plan(
        "llama-3-8b", gpus=8, gpu="H100", seq_len=4096, global_batch_size=64, fix={"backend": "deepspeed"}
    )
    ds = result.to_deepspeed()
    assert ds["zero_optimization"]["stage"] == result.plan.zero_stage
    assert ds["train_micro_batch_size_per_gpu"] == result.micro_batch_size
    assert ds["gradient_accumulation_steps"] == result.gradient_accumulation_steps
    assert ds["train_batch_size"] == 64
    fsdp = bigtrain.plan("llama-3-8b", gpus=8, gpu="H100", seq_len=4096, global_batch_size=64, fix={"backend": "fsdp2"})
    with pytest.raises(bigtrain.ConfigError, match="the plan's backend is fsdp2, not deepspeed"):
        fsdp.to_deepspeed()
    kwargs = fsdp.to_accelerate()
    plugin = kwargs["fsdp_plugin"]
    assert plugin.fsdp_version == 2 and plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    assert plugin.reshard_after_forward == (fsdp.plan.zero_stage == 3)
    assert kwargs["gradient_accumulation_steps"] == fsdp.gradient_accumulation_steps
    assert kwargs["mixed_precision"] == "bf16"


def test_pipeline_plans_say_the_trainer_cannot_take_them():
    result = bigtrain.plan("llama-3-70b", gpus=16, gpu="H100", seq_len=4096, global_batch_size=64, fix={"pp": 2})
    with pytest.raises(bigtrain.ConfigError, match="parallel.pp=2 cannot be exported --to hf-trainer"):
        result.to_training_arguments(output_dir="x")


def test_memory_check_line_compares_on_a_gpu_and_only_shows_on_a_cpu(caplog):
    from bigtrain.api.memory_check import MemoryCheck

    close = MemoryCheck(105 * 2**20, 100 * 2**20, "torch.cuda.max_memory_allocated", 0.10)
    assert close.within_tolerance and "prediction +5.0% of measured, within the planner's stated 10%" in close.line()
    far = MemoryCheck(150 * 2**20, 100 * 2**20, "torch.cuda.max_memory_allocated", 0.10)
    assert far.within_tolerance is False and "beyond" in far.line()
    result = bigtrain.plan("llama-3-8b", gpus=8, gpu="H100", seq_len=4096, global_batch_size=64)
    with caplog.at_level("INFO", logger="bigtrain"):
        check = bigtrain.check_memory(result, "cpu")
    assert check.measures == "peak RSS" and check.within_tolerance is None and check.measured_bytes > 0
    assert check.predicted_bytes == result.memory.total_bytes
    assert "bigtrain memory check: predicted peak" in caplog.text and "not compared" in caplog.text
    with pytest.raises(TypeError, match="a positive byte count"):
        bigtrain.check_memory("x")


def test_the_command_line_is_a_thin_caller_of_the_api():
    """bigtrain plan and bigtrain export search through bigtrain.api only: no planner search of their own."""
    for path in (REPO / "bigtrain/cli/plan.py", REPO / "bigtrain/cli/export.py"):
        text = Path(path).read_text()
        assert "from bigtrain.api" in text and "planner.search" not in text and "resolve_plan" not in text


def test_the_docs_plan_example_runs_as_written(capsys):
    """docs/api.md's first block, executed: the API shown is the API that exists."""
    text = (REPO / "docs/api.md").read_text()
    block = text.split("<!-- python:api-plan -->\n```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "docs/api.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("model llama: 8.03B params") and "fsdp2 zero2 dp=8" in out


def test_compile_is_carried_where_the_target_has_a_switch_and_fp8_is_said(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    from bigtrain.integrations.accelerate_config import to_yaml

    compiled = bigtrain.plan("llama-3-8b", gpus=8, gpu="H100", seq_len=4096, global_batch_size=64, compile=True)
    assert compiled.to_accelerate()["dynamo_plugin"].use_regional_compilation is True
    assert compiled.export("hf-trainer").content["torch_compile"] is True
    export = compiled.export("accelerate")
    path = tmp_path / "acc.yaml"
    path.write_text(to_yaml(export, compiled.recipe_config(), compiled.plan, "python"))
    assert load_config_from_file(str(path)).dynamo_config["dynamo_backend"] == "INDUCTOR"
    fp8 = bigtrain.plan("llama-3-8b", gpus=8, gpu="H100", seq_len=4096, global_batch_size=64, fp8="rowwise")
    assert fp8.fp8 == "rowwise"
    assert any(n.startswith("train.fp8=rowwise has no hf-trainer key") for n in fp8.export("hf-trainer").notes)


def test_hybrid_and_tensor_parallel_plans_hand_over_a_parallelism_config(tmp_path):
    result = bigtrain.plan(
        "llama-3-8b", gpus=16, gpu="H100", seq_len=4096, global_batch_size=64, fix={"tp": 2, "dp_replicate": 2}
    )
    assert (result.plan.dp_replicate, result.plan.dp_shard, result.plan.tp) == (2, 4, 2)
    parallelism = result.to_accelerate()["parallelism_config"]
    assert (parallelism.dp_replicate_size, parallelism.dp_shard_size, parallelism.tp_size) == (2, 4, 2)
    args = result.to_training_arguments(output_dir=str(tmp_path), use_cpu=True)
    assert (args.parallelism_config.tp_size, args.parallelism_config.dp_replicate_size) == (2, 2)
    assert args.fsdp and args.per_device_train_batch_size == result.micro_batch_size


def test_recipe_plan_chooses_what_a_written_plan_leaves_to_auto():
    """A written plan with train.method: auto: the method chosen for that plan, as bigtrain train chooses it."""
    result = bigtrain.recipe_plan(
        REPO / "recipes/quickstart.yaml", overrides=["train.method=auto"], gpus=2, gpu_memory="24GB"
    )
    cfg = load_recipe(REPO / "recipes/quickstart.yaml")
    # a tiny model on 24 GB GPUs: start-up's choice (choose_plan with the written plan fixed) is full fine-tuning
    assert result.method == "full" and result.plan == resolve_plan(cfg.parallel, 2, cfg.train)


def test_a_model_argument_wins_over_the_recipe_s_in_the_recipe_it_writes(tmp_path):
    folder = save_tiny_model(tmp_path / "m")
    result = bigtrain.plan(folder, recipe=REPO / "recipes/quickstart.yaml", gpus=2, gpu_memory="8GB", lora_r=4)
    recipe = result.to_recipe()
    assert recipe["model"]["name_or_path"] == str(folder) and recipe["model"].get("config") is None
    assert recipe["lora"]["r"] == 4 and recipe["data"]["path"] == load_recipe(REPO / "recipes/quickstart.yaml").data.path


@pytest.mark.skipif(torch.cuda.is_available(), reason="transformers accepts bf16 TrainingArguments on a bf16 GPU")
def test_training_arguments_for_a_cluster_built_on_a_laptop_say_what_to_do():
    result = bigtrain.plan("llama-3-8b", gpus=8, gpu="H100")  # as docs/api.md shows it
    with pytest.raises(ConfigError, match=r"TrainingArguments with bf16 mixed precision can only be built on a machine "
                       r"with a GPU that has it .* or pass use_cpu=True"):  # fmt: skip
        result.to_training_arguments(output_dir="out")
    assert result.to_training_arguments(output_dir="out", use_cpu=True).bf16
