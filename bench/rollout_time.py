"""grpo's phase split on 2 CPU gloo ranks: the planner's rollout and training times against a measured run.

    python bench/rollout_time.py                                   # probes this machine first (~5 minutes)
    python bench/rollout_time.py --profile bench/results/cpu_probe_rollout.json

``bigtrain train --nproc 2`` runs grpo on a Llama of width 256 from its config (4 blocks, the byte tokenizer's
vocabulary, the built-in sums prompts, completions of 24 tokens that a random model takes to the limit, 64 per step
over 2 ranks, fp32) for a few steps, each plan in turn. Measured, per step after the first two: the generation's
seconds (``time/generate_s``) and the rest of the step (its wall time less generation, rewards and log-probabilities).
Predicted: ``planner/rollout_time.py`` and ``cost.py`` with the profile's measured rates (``bigtrain probe``: the
small matmuls a decode step runs, and the host's seconds per forward of transformers' generate loop). The split is
the generation's share of the step. Prints the Markdown table recorded in ``bench/results/rollout_time_cpu.md``
(``--results bench/results/rollout_time_cpu.md``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MODEL = {
    "model_type": "llama",
    "vocab_size": 260,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
BATCH, GENERATIONS, COMPLETION, STEPS = 64, 8, 24, 6
PLANS = {
    "ddp": {"backend": "ddp", "micro_batch_size": 16},
    "fsdp2 zero2": {"backend": "fsdp2", "zero_stage": 2, "micro_batch_size": 16},
    "fsdp2 zero3": {"backend": "fsdp2", "zero_stage": 3, "micro_batch_size": 16},
}


def recipe(parallel: dict, output_dir: Path) -> dict:
    return {
        "model": {"config": MODEL},
        "data": {"path": "builtin:sums"},
        "train": {
            "objective": "grpo",
            "reward_functions": ["bigtrain.rewards:exact_answer"],
            "num_generations": GENERATIONS,
            "max_completion_length": COMPLETION,
            "steps": STEPS,
            "global_batch_size": BATCH,
            "mixed_precision": "fp32",
            "lr": 1e-4,
        },
        "parallel": parallel,
        "checkpoint": {"every": 0, "save_final_model": False},
        "output_dir": str(output_dir),
    }


def measure(parallel: dict, folder: Path) -> dict[str, float]:
    """Median seconds per step of generation and of the rest of the step, and the completions' mean length."""
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(parallel, folder / "out")))
    cmd = [sys.executable, "-m", "bigtrain", "train", str(path), "--nproc", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=folder, timeout=900)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    records = [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]
    walls = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(records, records[1:], strict=False)]
    kept = list(zip(records[2:], walls[1:], strict=False))
    generate = [r["time/generate_s"] for r, _ in kept]
    rest = [w - r["time/generate_s"] - r["time/reward_s"] - r["time/logps_s"] for r, w in kept]
    return {
        "generate_s": statistics.median(generate),
        "train_s": statistics.median(rest),
        "mean_length": statistics.mean(r["completions/mean_length"] for r, _ in kept),
    }


def predict(name: str, profile_path: str, prompt_len: int) -> dict[str, float]:
    """The planner's seconds per generation and per training step for plan ``name`` on 2 ranks."""
    from bigtrain.config.resolve import resolve_plan
    from bigtrain.config.schema import ParallelConfig, TrainConfig
    from bigtrain.config.workload import Generation, Workload
    from bigtrain.job import job_facts
    from bigtrain.planner.auto import CPU
    from bigtrain.planner.hardware import Cluster
    from bigtrain.planner.model_stats import ModelStats
    from bigtrain.planner.profile import gpu_from_profile, load_profile
    from bigtrain.planner.rollout_time import estimate_step_time

    gpu = gpu_from_profile(load_profile(profile_path), replace(CPU, memory_bytes=8 * 2**30))
    train = TrainConfig(global_batch_size=BATCH, objective="grpo")
    plan = resolve_plan(ParallelConfig(**PLANS[name]), 2, train)
    generation = Generation(prompt_len, COMPLETION, GENERATIONS, 1)
    workload = Workload(
        seq_len=prompt_len + COMPLETION, global_batch_size=BATCH, mixed_precision="fp32",
        job=replace(job_facts("grpo"), roles=()), generation=generation,
    )  # fmt: skip
    phases = dict(estimate_step_time(ModelStats.from_config(MODEL), plan, Cluster(gpu, 2, 2), workload).phases)
    return {"generate_s": phases["prefill"] + phases["decode"], "train_s": phases["train"]}


def prompt_length(folder: Path) -> int:
    """The longest prompt of the recipe's data in its tokenizer's ids (what every rank's batch pads to)."""
    from bigtrain.config.load import load_recipe
    from bigtrain.data.prompts import read_prompts

    path = folder / "prompts.yaml"
    path.write_text(yaml.safe_dump(recipe(PLANS["ddp"], folder / "prompts")))
    return read_prompts(load_recipe(path), COMPLETION, GENERATIONS).seq_len - COMPLETION


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", help="a bigtrain probe profile of this machine (default: probe it now)")
    parser.add_argument("--results", help="also write the table to this Markdown file")
    args = parser.parse_args()
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        profile_path = args.profile
        if profile_path is None:
            profile_path = str(Path(tmp) / "profile.json")
            cmd = [sys.executable, "-m", "bigtrain", "probe", "--nproc", "2", "-o", profile_path]
            subprocess.run(cmd, check=True, capture_output=True, cwd=REPO, timeout=900)
        prompt = prompt_length(Path(tmp))
        say(f"Llama width 256, 4 blocks; {BATCH} completions of {COMPLETION} tokens per step after prompts of at "
            f"most {prompt} tokens; 2 CPU ranks, fp32; profile `{profile_path}`\n")  # fmt: skip
        say("| plan | generate s: measured | predicted | train s: measured | predicted | split: measured "
            "| predicted | split error |")  # fmt: skip
        say("|---|---|---|---|---|---|---|---|")
        worst, lengths = 0.0, []
        for name, parallel in PLANS.items():
            folder = Path(tmp) / name.replace(" ", "_")
            folder.mkdir()
            m, p = measure(parallel, folder), predict(name, profile_path, prompt)
            lengths.append(m["mean_length"])
            split_m = m["generate_s"] / (m["generate_s"] + m["train_s"])
            split_p = p["generate_s"] / (p["generate_s"] + p["train_s"])
            worst = max(worst, abs(split_p / split_m - 1))
            say(f"| {name} | {m['generate_s']:.3f} | {p['generate_s']:.3f} | {m['train_s']:.3f} | {p['train_s']:.3f} "
                f"| {split_m:.0%} | {split_p:.0%} | {split_p / split_m - 1:+.0%} |")  # fmt: skip
        say(
            f"\nworst split error {worst:.0%} (completions' mean length {statistics.mean(lengths):.1f} of {COMPLETION})"
        )
    if args.results:
        Path(args.results).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
