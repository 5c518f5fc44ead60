"""``bigtrain plan`` end to end (exit codes, table, JSON contract) and ``parallel.plan: auto`` in the trainer."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from helpers import REPO, docs_commands, read_metrics, run_cli


@pytest.fixture
def plan_cli(cli_in_process):
    return cli_in_process


def test_table_names_the_choice_and_why_others_lost(plan_cli):
    proc = plan_cli(["plan", "--model", "llama-3-70b", "--gpus", "8", "--gpu", "H100"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("model llama: 70.55B params")
    assert any(line.startswith("* ") for line in lines)
    assert "best rejected:" in proc.stdout and "GiB budget" in proc.stdout


@pytest.mark.parametrize("model", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_a_mixture_of_experts_gets_a_fitting_explained_plan(plan_cli, model):
    """Families without formulas are measured (block_probe.py); a mixture states its active share and assumption."""
    proc = plan_cli(["plan", "--model", model, "--gpus", "8", "--gpu", "H100"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "B active: top-" in lines[0] and "assumed evenly loaded" in lines[0]
    assert any(line.startswith("* ") for line in lines)


def test_json_contract(plan_cli):
    proc = plan_cli(
        [
            "plan",
            "--model",
            "llama-3-8b",
            "--gpus",
            "8",
            "--gpu-memory",
            "80GB",
            "--json",
            "--seq-len",
            "4096",
            "--global-batch-size",
            "64",
            "--fix",
            "backend=fsdp2",
        ],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out["plan"]) == {
        "backend",
        "zero_stage",
        "grad_reduce",
        "dp_replicate",
        "dp_shard",
        "tp",
        "pp",
        "pp_schedule",
        "loss_parallel",
        "sequence_parallel",
        "pp_virtual_stages",
        "activation_checkpointing",
        "micro_batch_size",
        "offload_optimizer",
        "offload_params",
        "loss_chunk_tokens",
        "cp",
        "checkpoint_every",
        "offload_activations",
        "ep",
        "sync_batchnorm",  # capability records' parallel keys (classification's), carried by every plan
        "channels_last",
        "sync",  # replica_sync's
        "sync_every",
        "outer_lr",
        "outer_momentum",
        "fragments",
        "fragment_delay",
        "sync_dtype",
        "outer_state",
        "replica_failures",
        "reference",  # preference's
        "frozen_parts",  # text-to-image's
    }
    assert out["plan"]["backend"] == "fsdp2"
    assert set(out["memory"]) == {
        "total_bytes",
        "params_bytes",
        "grads_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "other_bytes",
        "margin_bytes",
    }
    assert set(out["time"]) == {"step_s", "tokens_per_s_per_device", "mfu"}
    assert out["model"]["params"] == 8030261248
    # "method": what is trained (full, lora, qlora): the planner's choice under --method auto, else the asked one
    assert out["method"] == "full"
    # "compile", "fp8": what the plan was timed for (the planner's choice under train.compile / train.fp8 auto)
    assert out["compile"] is False and out["fp8"] == "none"
    keys = {"plan", "method", "compile", "fp8", "memory", "time", "fits", "rejected_because"}
    assert all(set(c) == keys for c in out["candidates"])
    assert out["candidates"][0]["fits"] and out["candidates"][0]["plan"] == out["plan"]


def test_8b_on_8_h100_offers_plain_fsdp2_with_sharded_gradients(plan_cli):
    # the default batch (~1M tokens) takes many micro-steps; FSDP2 alone must fit when gradients stay sharded
    proc = plan_cli(["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "H100", "--json"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    fitting = [c["plan"] for c in out["candidates"] if c["fits"]]
    assert out["plan"]["backend"] == "fsdp2" and out["plan"]["tp"] == out["plan"]["pp"] == 1
    assert any(
        p["backend"] == "fsdp2"
        and p["tp"] == p["pp"] == 1
        and p["grad_reduce"] == "every_micro_step"
        and not p["offload_params"]
        for p in fitting
    )
    # offered: what the trainer runs, tp (with loss and sequence parallelism), pp and DeepSpeed among them; tp loses
    # here (its collectives and repeated work against a model that fits without it)
    assert any(p["tp"] > 1 and p["loss_parallel"] and p["sequence_parallel"] for p in fitting)
    assert any(p["pp"] > 1 for p in fitting) and any(p["backend"] == "deepspeed" for p in fitting)


def test_all_shows_what_the_trainer_cannot_run_yet_and_why(plan_cli):
    args = ["plan", "--model", "llama-3-70b", "--gpus", "64", "--gpu", "H100"]
    plain = plan_cli(args, timeout=120)
    every = plan_cli([*args, "--all"], timeout=120)
    assert plain.returncode == every.returncode == 0, every.stderr
    assert "not runnable yet" not in plain.stdout and "deepspeed zero3 dp=32 tp=2 " not in plain.stdout
    chosen = [line for line in plain.stdout.splitlines() if line.startswith("* ")]
    assert chosen and chosen == [line for line in every.stdout.splitlines() if line.startswith("* ")]
    section = every.stdout.split("not runnable yet")[1]
    assert "deepspeed zero3 dp=32 tp=2 " in section and "parallel.tp=2 runs with backend fsdp2" in section


def test_pins_that_only_unrunnable_plans_meet_are_refused_unless_all(tmp_path, plan_cli):
    args = ["plan", "--model", "llama-3-8b", "--gpus", "8", "--fix", "backend=deepspeed", "--fix", "tp=2"]
    proc = plan_cli(args, timeout=60)
    assert proc.returncode == 2
    assert "no plan the planner offers meets the pins: parallel.tp=2 runs with backend fsdp2" in proc.stderr
    assert "--all" in proc.stderr
    proc = plan_cli([*args, "--all", "--json"], timeout=60)
    out = json.loads(proc.stdout)
    assert out["fits"] is False and out["plan"]["backend"] == "deepspeed" and out["plan"]["tp"] == 2
    assert out["candidates"][0]["rejected_because"].startswith("not runnable yet: parallel.tp=2 runs with")


def test_nothing_fits_exits_3_with_a_way_out(plan_cli):
    # (405B on L4s has no way out at all: one of its blocks' backward alone needs more than an L4 holds; 70B on 8
    # L4s fits with tp=2 and parameter offload; on 4 it does not)
    proc = plan_cli(["plan", "--model", "llama-3-70b", "--gpus", "4", "--gpu", "L4", "--json"], timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["fits"] is False
    last = proc.stderr.strip().splitlines()[-1]
    # what these GPUs can do first (adapters, fastest first), more GPUs last
    assert last == (
        "bigtrain: no plan fits in 22.0 GiB per GPU. Would fit with lora adapters (--method lora: 11.3 GiB peak per "
        "GPU, 2740.325 s per step); or qlora adapters (--method qlora: 9.7 GiB peak per GPU, 2791.097 s per step); or "
        "8 GPUs (--gpus 8)."
    )


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--model", "llama-9", "--gpus", "8"], "neither a preset nor a local model folder"),
        (["--model", "llama-3-8b", "--gpus", "8", "--fix", "colour=red"], "unknown plan field"),
        (["--model", "llama-3-8b", "--gpus", "8", "--gpu-memory", "lots"], "--gpu-memory 'lots' is not a size"),
        (["--model", "llama-3-8b", "--gpus", "8", "--gpu", "Z80"], "--gpu 'Z80' is not a known GPU"),
        (["--model", "llama-3-8b"], "no GPU detected on this machine; give --gpus N"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, expected, tmp_path, plan_cli):
    proc = plan_cli(["plan", *args], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("bigtrain: error: ")
    assert expected in proc.stderr


def test_non_causal_config_exits_2(tmp_path, plan_cli):
    (tmp_path / "config.json").write_text('{"model_type": "t5", "d_model": 32}')
    proc = plan_cli(["plan", "--model", str(tmp_path / "config.json"), "--gpus", "2"], timeout=60)
    assert proc.returncode == 2 and "'t5' is not a causal language model" in proc.stderr


def test_recipe_with_plan_auto_trains(tmp_path):
    out = tmp_path / "auto"
    proc = run_cli(
        [
            "train",
            str(REPO / "recipes" / "auto_quickstart.yaml"),
            "--nproc",
            "2",
            "--set",
            "train.steps=4",
            "--set",
            f"output_dir={out}",
        ],
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "auto chose the plan:" in proc.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert plan["backend"] in ("ddp", "fsdp2") and plan["dp_replicate"] * plan["dp_shard"] == 2
    assert len(read_metrics(out)) == 4


@pytest.mark.full
def test_compile_and_fp8_auto_are_chosen_at_start_and_recorded(tmp_path):
    """train.compile / train.fp8 auto: the planner decides them with the plan; on this CPU, with no probe profile
    that measured FP8 matmuls, FP8 is not weighed; the checkpoint's recipe records the choice."""
    out = tmp_path / "auto"
    sets = ["train.steps=2", "train.compile=auto", "train.fp8=auto", f"output_dir={out}"]
    args = ["train", str(REPO / "recipes" / "auto_quickstart.yaml")]
    proc = run_cli(args + [x for s in sets for x in ("--set", s)], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    chose = re.search(r"auto chose train.compile=(true|false) and train.fp8=none and the plan:", proc.stderr)
    assert chose, proc.stderr[-2000:]
    saved = (next((out / "checkpoints").iterdir()) / "recipe.yaml").read_text()
    assert "fp8: none" in saved and f"compile: {chose.group(1)}" in saved
    # resumed with the same recipe (auto): the saved choices, not a refusal for a changed recipe
    proc = run_cli(args + [x for s in [*sets[1:], "train.steps=3"] for x in ("--set", s)], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stderr and len(read_metrics(out)) == 3


@pytest.mark.parametrize("pin", ["backend=fsdp2", "pp=2"])
def test_simulate_adds_the_simulated_peak(tmp_path, pin, plan_cli):
    """--simulate runs the chosen plan's step on fake tensors; a pipelined plan on every pp rank (the busiest kept)."""
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4000}'
    )
    proc = plan_cli(
        [
            "plan",
            "--model",
            str(tmp_path / "config.json"),
            "--gpus",
            "8",
            "--gpu-memory",
            "4GB",
            "--seq-len",
            "512",
            "--global-batch-size",
            "16",
            "--fix",
            pin,
            "--simulate",
            "--json",
        ],
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["simulated"]["world_size"] == 8
    assert abs(out["memory"]["total_bytes"] / out["simulated"]["peak_bytes"] - 1) < 0.10
    assert ("pp_rank" in out["simulated"]) == (pin == "pp=2")


def test_simulate_says_it_does_not_simulate_a_deepspeed_choice(plan_cli):
    args = ["plan", "--model", "qwen2.5-0.5b", "--gpus", "8", "--gpu", "H100", "--fix", "backend=deepspeed"]
    proc = plan_cli([*args, "--simulate", "--json"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["plan"]["backend"] == "deepspeed" and "simulated" not in json.loads(proc.stdout)
    assert (
        "--simulate cannot simulate the chosen plan: DeepSpeed's own step does not run on fake tensors" in proc.stderr
    )


def test_the_docs_plan_commands_run_and_say_what_the_docs_say(cli_in_process):
    """docs/planner.md's commands, as written; its worked example's choice and peak are the ones it quotes."""
    outputs = {}
    for command in docs_commands("plan"):
        proc = cli_in_process(shlex.split(command)[1:])
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        outputs[command] = proc.stdout
    example = outputs["bigtrain plan --model llama-3-8b --gpus 8 --gpu H100"]
    chosen = next(line for line in example.splitlines() if line.startswith("* "))
    assert chosen.split()[1:10] == "fsdp2 zero2 dp=8 tp=1 pp=1 ac=none mb=2 rs=micro 60.5".split()
    text = (REPO / "docs" / "planner.md").read_text()
    assert "chooses `fsdp2 zero2 dp=8 tp=1 pp=1 ac=none mb=2 rs=micro` at 60.5 GiB" in " ".join(text.split())


def test_a_vision_language_plan_counts_each_row_s_image_tokens(plan_cli):
    """docs/vision-language.md's commands: the images' tokens in the row, the vision side in the model's count, and
    a row too short for its images refused with what would hold them."""
    first, second = docs_commands("vlm-plan")
    proc = plan_cli(shlex.split(first)[1:], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "vision 676.55M params; 2 image(s) of 1024 px per row = 2,738 of its 4096 tokens" in proc.stdout
    assert proc.stdout.startswith("model qwen2_5_vl: 8.29B params, 28 layers, hidden 3584")
    assert not proc.stderr.strip(), proc.stderr  # nothing from transformers about the rotary sections
    proc = plan_cli(shlex.split(second)[1:], timeout=120)
    assert proc.returncode == 0 and "method lora" in proc.stdout, proc.stderr
    proc = plan_cli([*shlex.split(first)[1:], "--seq-len", "2048"], timeout=120)
    assert proc.returncode != 0
    assert "2 image(s) of 1024 px per row are 2,738 image tokens, more than the row's 2048 tokens" in proc.stderr


def test_a_classifier_plan_shows_the_speed_up_from_one_gpu(plan_cli):
    """docs/vision.md's command: the LM table's layout (the backends' rows, the choice, the near ties said once), and
    the scaling view from 1 GPU to 8 with what it leaves out."""
    for command in docs_commands("vision-plan"):
        proc = plan_cli(shlex.split(command)[1:], timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("model resnet image-classification (3x224x224 px per example): 25.56M params")
        assert "\n* ddp dp=8 tp=1 pp=1 ac=none mb=256 channels_last=True " in proc.stdout
        assert proc.stdout.count("  near tie: within 2% of the fastest step") == 1
        assert "not modelled: the input pipeline" in proc.stdout
        rows = re.findall(r"^\s+(\d+)\s+([\d,]+)\s+([\d.]+)x\s+(\d+)%", proc.stdout, re.MULTILINE)
        assert [int(r[0]) for r in rows] == [1, 2, 4, 8] and float(rows[-1][2]) > 7
        assert not proc.stderr.strip(), proc.stderr


def test_a_classifier_recipe_s_written_plan_is_predicted_first(plan_cli):
    proc = plan_cli(["plan", "recipes/image_classifier.yaml", "--gpus", "2", "--gpu", "H100"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    own = "the recipe's own plan (what bigtrain train runs): ddp dp=2 tp=1 pp=1 ac=none mb=16 sync_batchnorm=True: "
    assert first.startswith(own + "peak 2.9 MiB per GPU, ")
    assert first.endswith("the planner's choice below is as fast") and "-0.0%" not in proc.stdout
    assert proc.stdout.splitlines()[1].startswith("model resnet image-classification (3x32x32 px per example)")


def test_an_lm_recipe_s_written_plan_is_predicted_first_then_the_choice(plan_cli):
    proc = plan_cli(["plan", "recipes/deepspeed_zero3.yaml", "--gpus", "2", "--gpu", "H100"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(
        "the recipe's own plan (what bigtrain train runs): deepspeed zero3 dp=2 tp=1 pp=1 ac=none mb=2: peak "
    )
    assert "micro-batch 2 x accumulation 4" in lines[0] and re.search(
        r"the planner's choice below is [\d.]+% faster", lines[0]
    )
    assert lines[1].startswith("model llama: 828.54K params")
    assert "-0.0%" not in proc.stdout  # an exact tie reads "as fast"


def test_legend_explains_every_abbreviation_and_column(plan_cli):
    from bigtrain.planner.explain import LEGEND

    proc = plan_cli(["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "H100", "--legend"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    legend = proc.stdout.split("plan names:")[1]
    for abbreviation, _, _ in LEGEND:
        assert f"\n  {abbreviation} " in legend, abbreviation
    assert "peak GiB: predicted peak of tensor memory per GPU" in legend.split("columns:")[1]


def test_help_says_what_all_shows_without_claiming_an_engine_cannot_run(plan_cli):
    proc = plan_cli(["plan", "--help"], timeout=60)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "--all also show the plans the trainer cannot run yet" in text
    assert not re.search(r"(deepspeed|pp|pipeline)[^.]*cannot run", text, re.IGNORECASE), text


def test_grpo_is_planned_as_a_rollout_then_training(plan_cli):
    """The issue's command: the table says each phase's seconds and peak under the chosen plan."""
    args = ["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "H100", "--objective", "grpo"]
    proc = plan_cli([*args, "--completion-length", "1024", "--num-generations", "8"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "x seq 1536" in proc.stdout.splitlines()[0]  # 512 prompt tokens (TRL's default) + 1024
    said = " ".join(line.strip() for line in proc.stdout.splitlines())
    assert re.search(r"rollouts: \d+ completions per rank .* prefill [\d.]+ s, decode [\d.]+ s \(1024 tokens", said)
    assert re.search(r"peak: generation [\d.]+ GiB, training [\d.]+ GiB", said)
    bad = plan_cli([*args, "--seq-len", "2048"], timeout=60)
    assert bad.returncode == 2 and "--seq-len 2048: a grpo row is its prompt and its completion" in bad.stderr
