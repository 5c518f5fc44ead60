"""A task is one file and one line, and so is an objective: a toy task (toy_task.py: a regression head, one number per
text) and a toy objective (toy_objective.py: the mean squared error), copied into a copy of the package as
``bigtrain/tasks/regression.py`` and ``bigtrain/objectives/mse.py`` with one line each in their ``RECORDS``, are seen
by ``bigtrain plan``, start-up, the simulator, training on 2 ranks, export and the generated docs, with nothing else
edited. Training's first step is checked against a plain loop: its loss and gradient norm are the whole global
batch's mean squared error and its gradient, however the batch was split over ranks and micro-steps."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, recipe_dict, write_recipe

HERE = Path(__file__).parent
TASK_LINE = '    "sequence_classification",\n'  # the last task's line: the toy's goes after it
OBJECTIVE_LINE = '    "simpo",\n'  # the last objective's line
TEXTS = ["a cat sat", "the dog ran far", "birds sing at dawn", "fish swim", "a long quiet night", "rain", "sun and sky",
         "the old tree", "wind in the grass", "snow fell", "stars", "the river bends", "a red door", "green hills",
         "an open book", "the last train"]  # fmt: skip


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """A copy of the repository's package and docs with the toy task's and the toy objective's file and line."""
    root = tmp_path_factory.mktemp("toy")
    shutil.copytree(REPO / "bigtrain", root / "bigtrain", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "README.md", root / "README.md")
    for source, folder, line, name in (
        ("toy_task.py", "tasks", TASK_LINE, "regression"),
        ("toy_objective.py", "objectives", OBJECTIVE_LINE, "mse"),
    ):
        shutil.copy(HERE / source, root / "bigtrain" / folder / f"{name}.py")  # the one file
        init = root / "bigtrain" / folder / "__init__.py"
        text = init.read_text()
        assert text.count(line) == 1
        init.write_text(text.replace(line, line + f'    "{name}",\n'))  # the one line
    return root


def run(package: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(package)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=package, env=env)


@pytest.fixture(scope="module")
def recipe(package, tmp_path_factory) -> Path:
    """A tiny BERT saved with a one-output head (no dropout: the plain loop's step is the trainer's), 16 texts with
    their targets, fsdp2 on 2 ranks with 2 micro-steps."""
    from transformers import BertConfig, BertForSequenceClassification

    root = tmp_path_factory.mktemp("toy_run")
    config = BertConfig(vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_labels=1, problem_type="regression", pad_token_id=256,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    BertForSequenceClassification(config).save_pretrained(root / "bert")
    data = root / "targets.jsonl"
    data.write_text("".join(json.dumps({"text": t, "target": len(t) / 10}) + "\n" for t in TEXTS))
    raw = recipe_dict(
        root / "out", data, root / "bert",
        data={"seq_len": 24, "shuffle": False},
        train={"steps": 2, "global_batch_size": 8, "lr": 1e-3},
        parallel={"micro_batch_size": 2},
    )  # fmt: skip
    raw["model"]["task"] = "regression"
    return write_recipe(root / "toy.yaml", raw)


def test_the_copy_has_the_toys_and_the_repository_does_not(package):
    proc = run(package, "-c", "from bigtrain.job import TASKS, OBJECTIVES; print(sorted(TASKS), sorted(OBJECTIVES))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "'regression'" in proc.stdout and "'mse'" in proc.stdout
    from bigtrain.job import OBJECTIVES, TASKS

    assert "regression" not in TASKS and "mse" not in OBJECTIVES


def test_every_consumer_sees_the_toy_task_and_objective(package, recipe):
    script = f"""
import json, io, contextlib, sys
from bigtrain.cli import main

def cli(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(args))
    return code, out.getvalue()

# the planner: the task's statistics, its rows (data parallelism only), its unit
code, text = cli("plan", "{recipe}", "--gpus", "2", "--gpu-memory", "24GB", "--json")
assert code == 0, text
planned = json.loads(text)
assert planned["model"]["task"] == "regression", planned["model"]
assert all(c["plan"]["tp"] == 1 for c in planned["candidates"])
code, text = cli("plan", "{recipe}", "--gpus", "2", "--gpu-memory", "24GB")
assert "ex/s/dev" in text, text

# the simulator: the task's synthetic micro-batch and the objective's loss, on fake tensors
from bigtrain.config.capabilities import option_defaults
from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.job import job_facts
from bigtrain.measure.simulate import simulate
from bigtrain.models.build import load_hf_config
from bigtrain.config.load import load_recipe
cfg = load_recipe("{recipe}")
hf = load_hf_config(cfg.model)
plan = Plan(backend="fsdp2", zero_stage=3, grad_reduce="every_micro_step", dp_replicate=1, dp_shard=2, tp=1, pp=1,
            pp_schedule="1f1b", activation_checkpointing="none", micro_batch_size=2, offload_optimizer=False,
            offload_params=False, options=option_defaults())
workload = Workload(seq_len=24, global_batch_size=8, mixed_precision="fp32", job=job_facts("mse", "regression"))
peak = simulate({{**hf.to_dict(), "model_type": hf.model_type}}, plan, workload)["Total"]
assert peak > 0, peak

# the generated docs: a row of each table
sys.path.insert(0, "docs")
import generate
assert "| `regression` | toy regression head: one number per text | examples/s | **mse** |" in generate.task_table()
assert "| `mse` | toy mean squared error of one number per example | examples |" in generate.objective_table()

# start-up, on every rank before any group: a plan the task's rows refuse is one line
code, _ = cli("train", "{recipe}", "--dry-run", "--nproc", "2", "--set", "parallel.tp=2")
assert code == 2
print("ok")
"""
    proc = run(package, "-c", script, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
    assert "parallel.tp=2 with model.task=regression is not built yet" in proc.stderr


def test_training_on_two_ranks_steps_as_a_plain_loop_and_exports_the_head(package, recipe):
    import torch
    from transformers import AutoModelForSequenceClassification

    proc = run(package, "-m", "bigtrain", "train", str(recipe), "--nproc", "2", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = recipe.parent / "out"
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    # the plain loop: the first global batch (rows 0-7, unshuffled), its mean squared error and gradient
    model = AutoModelForSequenceClassification.from_pretrained(recipe.parent / "bert").train()
    ids = [list(t.encode("utf-8")) for t in TEXTS[:8]]
    longest = max(map(len, ids))
    batch = torch.tensor([row + [256] * (longest - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (longest - len(row)) for row in ids])
    targets = torch.tensor([len(t) / 10 for t in TEXTS[:8]])
    loss = ((model(input_ids=batch, attention_mask=mask).logits.squeeze(-1) - targets) ** 2).mean()
    loss.backward()
    grad_norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None))
    assert first["loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert first["grad_norm"] == pytest.approx(grad_norm.item(), rel=1e-4)
    assert "examples_per_s" in first
    exported = AutoModelForSequenceClassification.from_pretrained(out / "model")
    assert exported.config.problem_type == "regression" and exported.config.num_labels == 1
    assert (out / "model" / "tokenizer_config.json").is_file()  # the byte tokenizer it read its texts with
