"""The walk-throughs of docs/fine-tuning.md, docs/preference.md ("fine-tune a local HF model and get it back", "fine-tune a chat model,
evaluate it and plot the run"), read from the doc and run as written (in a scratch folder holding a link to
``recipes/``), each command of which must succeed; then their results are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, docs_commands

pytestmark = pytest.mark.full  # the full tier; tests/tiers.py moves some beyond CI (docs/testing.md)


def run_as_written(commands: list[str], folder: Path) -> list[subprocess.CompletedProcess]:
    if not (folder / "recipes").exists():  # a second block of the same walk-through
        (folder / "recipes").symlink_to(REPO / "recipes")
    # `python` and `bigtrain` are this interpreter's (the installed console script lives next to it)
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    outputs = []
    for command in commands:
        proc = subprocess.run(command, shell=True, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{command}\n{proc.stderr[-3000:]}"
        outputs.append(proc)
    return outputs


def test_walkthrough_runs_as_written(tmp_path):
    from safetensors.torch import load_file

    commands = docs_commands("walkthrough")
    assert len(commands) == 5
    outputs = run_as_written(commands, tmp_path)

    run = tmp_path / "demo" / "run"
    assert outputs[2].stdout.startswith("LlamaForCausalLM ")  # step 3 loaded the trained model
    assert "resuming from demo/run/checkpoints/step_20 (step 20 of 30)" in outputs[3].stderr
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 31))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_20", "step_30"]  # keep: 2
    exported = load_file(str(tmp_path / "demo" / "step_20" / "model.safetensors"))
    final = load_file(str(run / "model" / "model.safetensors"))
    assert set(exported) == set(final)
    assert any(not (exported[k] == final[k]).all() for k in final)  # step 20 and step 30 are different models


def test_chat_walkthrough_runs_as_written(tmp_path):
    commands = docs_commands("chat-walkthrough")
    assert len(commands) == 4
    outputs = run_as_written(commands, tmp_path)
    run = tmp_path / "chat_demo" / "run"
    assert (
        "chat: 2000 examples" in outputs[1].stderr
        and "eval: chat_demo/eval.jsonl (chat: 100 examples" in outputs[1].stderr
    )
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    assert [step for step, _ in evaluated] == [10, 20, 30, 40]
    assert evaluated[-1][1] < 0.8 * evaluated[0][1]  # the held-out loss falls (measured 3.64 -> 2.15)
    assert not (run / "tensorboard").exists()  # the README's install has no TensorBoard: the recipe asks none
    assert outputs[2].stdout.split() == [
        f"chat_demo/run/report/{n}.png" for n in ("loss", "lr", "tokens_per_s", "memory")
    ]
    assert all((tmp_path / p).stat().st_size > 10_000 for p in outputs[2].stdout.split())
    model = run / "model"
    assert (model / "chat_template.jinja").is_file() and (model / "tokenizer.json").is_file()
    answer = outputs[3].stdout.strip()
    assert answer.startswith("'") and len(answer) > 2  # generated text (what it says after 40 steps: see the README)


def test_adapter_walkthrough_runs_as_written(tmp_path):
    commands = docs_commands("adapter-walkthrough")
    assert len(commands) == 5
    outputs = run_as_written(commands, tmp_path)
    run = tmp_path / "chat_demo" / "lora"
    assert "lora: adapters of rank 8 (alpha 16) on a frozen base" in outputs[1].stderr
    name, count = outputs[2].stdout.split()
    assert name == "PeftModelForCausalLM" and int(count) > 0
    config = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16
    # portable: the base by its absolute path, the tokenizer beside the adapter (it loads from any directory)
    assert config["base_model_name_or_path"] == str((tmp_path / "chat_demo" / "base").resolve())
    assert (run / "adapter" / "tokenizer.json").is_file() and (run / "adapter" / "chat_template.jinja").is_file()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r["eval_loss"] for r in records if "eval_loss" in r]
    assert len(records) == 40 and evaluated[-1] < evaluated[0]  # the adapters learn
    answer = outputs[4].stdout.strip()
    assert answer.startswith("'") and len(answer) > 2


def test_vision_walkthrough_runs_as_written(tmp_path):
    """docs/vision.md: a ResNet on the built-in shapes (2 workers, synchronised BatchNorm), its held-out accuracy,
    and the exported folder classifying pictures through transformers' pipeline."""
    import ast

    from bigtrain.data.synthetic_images import CLASSES

    commands = docs_commands("vision-walkthrough")
    assert len(commands) == 4
    outputs = run_as_written(commands, tmp_path)
    assert "sync_batchnorm" in (tmp_path / "vision_demo" / "recipe.yaml").read_text()
    assert float(outputs[1].stdout) > 0.5  # 10 classes: chance is 0.1; measured 0.71 after the 200 steps
    labels = ast.literal_eval(outputs[2].stdout.strip().splitlines()[-1])
    assert len(labels) == 4 and set(labels) <= set(CLASSES)
    assert (tmp_path / "vision_demo" / "report" / "accuracy.png").is_file()


def test_slow_links_walkthrough_runs_as_written(tmp_path):
    """docs/slow-links.md: the planner picks DiLoCo over two sites at 10 Gb/s and keeps synchronous training at 400
    Gb/s; the DiLoCo quickstart trains 2 CPU replica groups and logs the synchronised model's held-out loss."""
    commands = docs_commands("slow-links")
    assert len(commands) == 3
    outputs = run_as_written(commands, tmp_path)
    two_sites, one_site = outputs[0].stdout, outputs[1].stdout
    chosen = next(line for line in two_sites.splitlines() if line.startswith("* "))
    assert "diloco H=" in chosen and "every-step training waits" in two_sites
    assert "diloco" not in next(line for line in one_site.splitlines() if line.startswith("* "))
    records = [
        json.loads(line) for line in (tmp_path / "outputs" / "diloco_demo" / "metrics.jsonl").read_text().splitlines()
    ]
    held_out = [r["eval_loss"] for r in records if "eval_loss" in r]
    assert len(held_out) == 3 and held_out[-1] < held_out[0] < 3.5  # measured: 2.43, 1.81, 1.49
    assert (tmp_path / "outputs" / "diloco_demo" / "model" / "model.safetensors").is_file()


def test_preference_walkthrough_runs_as_written(tmp_path):
    """docs/preference.md: SFT on the chat demo, DPO from its model on the built-in pairs, the rewards plotted."""
    commands = docs_commands("preference-walkthrough")
    assert len(commands) == 4
    outputs = run_as_written(commands, tmp_path)
    run = tmp_path / "chat_demo" / "dpo"
    assert "reference=sharded" in outputs[2].stderr and "preference: 2000 pairs" in outputs[2].stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 30 and records[0]["loss"] == pytest.approx(0.6931, abs=1e-3)  # the policy is its reference
    evaluated = [r for r in records if "eval_rewards/accuracies" in r]
    assert [r["step"] for r in evaluated] == [10, 20, 30]
    assert evaluated[-1]["eval_rewards/accuracies"] >= 0.6 and evaluated[-1]["eval_rewards/margins"] > 0.5
    plots = outputs[3].stdout.split()
    assert "chat_demo/dpo/report/rewards.png" in plots and "chat_demo/dpo/report/reward_accuracy.png" in plots
    assert (run / "model" / "model.safetensors").is_file()


def test_data_prepare_walkthrough_runs_as_written(tmp_path):
    """docs/data.md: the chat demo's data built into its cache by ``bigtrain prepare``; the training that follows
    (2 ranks) maps the entries prepare wrote, tokenising nothing."""
    commands = docs_commands("data-prepare")
    assert len(commands) == 3
    outputs = run_as_written(commands, tmp_path)
    cache = tmp_path / "chat_demo" / "cache"
    built = [line for line in outputs[1].stderr.splitlines() if "data cache" in line]
    assert len(built) == 2 and all("(built in" in line for line in built), outputs[1].stderr[-2000:]
    assert "chat: 2000 examples, 2000 documents-packed rows of 512" in built[0]
    used = [line for line in outputs[2].stderr.splitlines() if line.startswith("bigtrain: data") and "cache" in line]
    assert len(used) == 2 and all(line.endswith("(read)") for line in used), outputs[2].stderr[-2000:]
    assert {p.name for p in cache.iterdir() if not p.name.startswith(".")} == {
        line.split("data cache ")[1].split(" (")[0].rsplit("/", 1)[1] for line in built
    }
    records = (tmp_path / "chat_demo" / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in records] == [1, 2, 3, 4]


def test_vision_language_walkthrough_runs_as_written(tmp_path):
    """docs/vision-language.md: a tiny LLaVA, LoRA adapters with the processor, an answer through them, full
    fine-tuning, and the final folder answering through transformers' own pipeline."""
    commands = docs_commands("vlm-walkthrough")
    assert len(commands) == 5
    outputs = run_as_written(commands, tmp_path)
    adapter = tmp_path / "vlm_demo" / "lora" / "adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "preprocessor_config.json").is_file()
    assert outputs[2].stdout.strip()  # an answer about the picture, through the adapters
    records = [json.loads(line) for line in (tmp_path / "vlm_demo" / "full" / "metrics.jsonl").read_text().splitlines()]
    held_out = [r["eval_loss"] for r in records if "eval_loss" in r]
    assert len(held_out) == 3 and held_out[-1] < 0.6 * held_out[0]  # measured: 5.5 then 0.37 (the answers' form)
    assert outputs[4].stdout.strip().startswith("A")  # the pipeline's answer, e.g. "A triangle."


def test_grpo_walkthrough_runs_as_written(tmp_path):
    """docs/rl.md: a tiny model's supervised start on sums, then GRPO with LoRA raising its sampled accuracy."""
    commands = docs_commands("grpo-walkthrough")
    assert len(commands) == 2
    outputs = run_as_written(commands, tmp_path)
    assert "global batch 256 completions = micro 64 x dp 2 x accum 2" in outputs[1].stderr
    assert "Warning" not in outputs[1].stderr and "warn" not in outputs[1].stderr, outputs[1].stderr[-2000:]
    run = tmp_path / "sums_demo" / "grpo_lora"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in records]
    # measured: 0.59 over the first 10 steps, 0.98 over the last 10
    assert len(rewards) == 120 and sum(rewards[-30:]) / 30 >= 0.8 and sum(rewards[:10]) / 10 < 0.7
    assert (run / "adapter" / "adapter_config.json").is_file()
    samples = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 41, 81} and {"prompt", "completion", "reward"} <= set(samples[0])


def test_reward_walkthrough_runs_as_written(tmp_path):
    """docs/rl.md: SFT on the chat demo, a reward model of its model on the built-in pairs, loaded back by
    transformers."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    commands = docs_commands("reward-walkthrough")
    assert len(commands) == 3
    outputs = run_as_written(commands, tmp_path)
    assert "a new one is made" in outputs[2].stderr and "preference: 2000 pairs" in outputs[2].stderr
    run = tmp_path / "chat_demo" / "reward"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if "eval_accuracy" in r]
    assert [r["step"] for r in evaluated] == [20, 40]
    # measured: 0.71 then 0.72 held-out accuracy, margins 0.61 then 0.80
    assert evaluated[-1]["eval_accuracy"] >= 0.65 and evaluated[-1]["eval_margin"] > evaluated[0]["eval_margin"] > 0.3
    model = AutoModelForSequenceClassification.from_pretrained(run / "model")
    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
    inputs = tokenizer.apply_chat_template(messages, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        assert model(**inputs).logits.shape == (1, 1)


def test_elastic_drill_runs_as_written(tmp_path):
    """docs/elastic.md's drill: rank 1 of 2 leaves for good before step 20; the run starts again on one rank from the
    step-10 checkpoint and finishes, saying each in one line."""
    (command,) = docs_commands("elastic-drill")
    (proc,) = run_as_written([command], tmp_path)
    said = [line for line in proc.stderr.splitlines() if line.startswith("bigtrain: elastic:")]
    assert len(said) == 2, proc.stderr[-3000:]
    assert said[0].startswith("bigtrain: elastic: lost rank 1 (device 1) for good; starting again on 1 rank(s)")
    assert (
        said[1].startswith("bigtrain: elastic: 2 -> 1 rank(s): plan fsdp2 zero3 dp=2")
        and "-> fsdp2 zero3 dp=1" in said[1]
    )
    assert "resumed at step 10, 9 step(s) lost since that checkpoint" in said[1]
    steps = [json.loads(line)["step"] for line in (tmp_path / "drill" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 31)) and "Traceback" not in proc.stderr


def test_embedding_walkthrough_runs_as_written(tmp_path):
    """docs/embedding.md: a small BERT on the built-in questions and stories, 2 ranks through the gradient cache, its
    held-out retrieval over all 200 stories, the final folder read by sentence-transformers."""
    from sentence_transformers import SentenceTransformer

    (proc,) = run_as_written(docs_commands("embedding-walkthrough"), tmp_path)
    run = tmp_path / "outputs" / "embedding"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if "eval_accuracy" in r]
    assert [r["step"] for r in evaluated] == [50, 100] and evaluated[-1]["eval_anchors"] == 200
    # measured: accuracy@1 0.28 then 0.31, MRR@10 0.44 then 0.51, recall@10 0.83 then 0.905 (chance at 1: 0.005)
    assert evaluated[-1]["eval_accuracy"] > 0.2 and evaluated[-1]["eval_recall_at_10"] > 0.8
    assert evaluated[-1]["eval_mrr_at_10"] > evaluated[0]["eval_mrr_at_10"]
    assert "Traceback" not in proc.stderr
    vectors = SentenceTransformer(str(run / "model"), device="cpu").encode(["where is the fox?", "a fox"])
    assert vectors.shape == (2, 128)


def test_diffusion_walkthrough_runs_as_written(tmp_path):
    """docs/diffusion.md: the tiny FLUX pipeline's LoRA on the captioned shapes, 2 ranks, its held-out loss going
    down, the adapter read by diffusers' pipeline, and its picture for a prompt drawn by ``bigtrain generate``."""
    pytest.importorskip("diffusers")
    from diffusers import FluxPipeline

    make, train = run_as_written(docs_commands("diffusion-walkthrough"), tmp_path)
    run = tmp_path / "outputs" / "flux_lora"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if "eval_loss" in r]
    # measured: held-out loss 1.468 at step 30, 1.426 at step 60; training loss 1.79 at step 1, 1.35 at step 60
    assert [r["step"] for r in evaluated] == [30, 60] and evaluated[1]["eval_loss"] < evaluated[0]["eval_loss"]
    assert "Traceback" not in train.stderr
    pipe = FluxPipeline.from_pretrained(str(tmp_path / "outputs" / "flux_demo" / "pipeline"))
    pipe.load_lora_weights(str(run / "adapter"))
    assert any("lora" in name for name, _ in pipe.transformer.named_parameters())
    (drawn,) = run_as_written(docs_commands("diffusion-generate"), tmp_path)
    assert drawn.stdout.strip() == "generate: wrote outputs/flux_lora/disk.png (16x16 px, 8 steps, seed 0)"
    assert not drawn.stderr.strip(), drawn.stderr
    from PIL import Image

    assert Image.open(run / "disk.png").size == (16, 16)
