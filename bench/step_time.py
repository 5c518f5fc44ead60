"""The planner's step time against bigtrain's measured step, on 2 CPU gloo ranks, with and without a probed profile.

    python bench/step_time.py            # probes this machine first (bigtrain probe --nproc 2), ~4 minutes
    python bench/step_time.py --profile bench/results/cpu_probe.json

For each plan, ``bigtrain train --nproc 2`` runs a Llama of width 512 (4 blocks, 2k vocabulary, 256 tokens, global
batch 8, fp32) for a few steps; the measured step time is the median over the steps after the first two (the first
pays start-up). Predicted: ``planner/cost.py`` with the profile's measured rates and link (``planner/profile.py``),
and with the built-in CPU stand-in of ``plan: auto`` (0.5 TFLOP/s, 10 GB/s), which is what the planner used before.
Prints the Markdown table recorded in ``bench/results/step_time_cpu.md``.
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
    "vocab_size": 2048,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
SEQ, BATCH, STEPS = 256, 8, 6
PLANS = {
    "ddp": {"backend": "ddp", "micro_batch_size": 4},
    "fsdp2 zero2": {"backend": "fsdp2", "zero_stage": 2, "micro_batch_size": 4},
    "fsdp2 zero3": {"backend": "fsdp2", "zero_stage": 3, "micro_batch_size": 4},
    "fsdp2 zero3 accum 4": {"backend": "fsdp2", "zero_stage": 3, "micro_batch_size": 1},
    "fsdp2 zero3 ac=full": {
        "backend": "fsdp2",
        "zero_stage": 3,
        "micro_batch_size": 4,
        "activation_checkpointing": "full",
    },
    "deepspeed zero2": {"backend": "deepspeed", "zero_stage": 2, "micro_batch_size": 4},
    "fsdp2 tp=2": {"backend": "fsdp2", "tp": 2, "micro_batch_size": 4},
}


def run(parallel: dict, folder: Path) -> float:
    """Median measured seconds per optimizer step."""
    recipe = {
        "model": {"config": MODEL},
        "data": {"path": "builtin:stories", "seq_len": SEQ},
        "train": {"steps": STEPS, "global_batch_size": BATCH, "lr": 1e-3},
        "parallel": parallel,
        "checkpoint": {"every": 0, "save_final_model": False},
        "output_dir": str(folder / "out"),
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    cmd = [sys.executable, "-m", "bigtrain", "train", str(path), "--nproc", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    records = [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(BATCH * SEQ / r["tokens_per_s"] for r in records[2:])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", help="a bigtrain probe profile of this machine (default: probe it now)")
    args = parser.parse_args()
    from bigtrain.config.plan import resolve_plan
    from bigtrain.config.schema import ParallelConfig
    from bigtrain.planner.auto import CPU
    from bigtrain.planner.cost import estimate_time
    from bigtrain.planner.hardware import Cluster
    from bigtrain.planner.model_stats import ModelStats
    from bigtrain.planner.profile import gpu_from_profile, load_profile

    with tempfile.TemporaryDirectory() as tmp:
        profile_path = args.profile
        if profile_path is None:
            profile_path = str(Path(tmp) / "profile.json")
            cmd = [sys.executable, "-m", "bigtrain", "probe", "--nproc", "2", "-o", profile_path]
            subprocess.run(cmd, check=True, capture_output=True, cwd=REPO, timeout=300)
        profile = load_profile(profile_path)
        stats = ModelStats.from_config(MODEL)
        table = Cluster(CPU, 2, 2)
        probed = Cluster(gpu_from_profile(profile, replace(CPU, memory_bytes=8 * 2**30)), 2, 2)
        print(f"profile: {profile['device']}, torch {profile['torch']}, {profile['date']}")
        print()
        print("| plan | measured s/step | predicted (profile) | error | predicted (built-in CPU) | error |")
        print("|---|---|---|---|---|---|")
        errors = []
        for name, parallel in PLANS.items():
            plan = resolve_plan(ParallelConfig(**parallel), 2, BATCH)
            folder = Path(tmp) / name.replace(" ", "_").replace("=", "")
            folder.mkdir()
            measured = run(parallel, folder)
            with_profile = estimate_time(stats, plan, probed, SEQ, BATCH, "fp32").step_s
            built_in = estimate_time(stats, plan, table, SEQ, BATCH, "fp32").step_s
            errors.append(with_profile / measured - 1)
            print(
                f"| {name} | {measured:.3f} | {with_profile:.3f} | {with_profile / measured - 1:+.0%} "
                f"| {built_in:.3f} | {built_in / measured - 1:+.0%} |",
                flush=True,
            )
        print(f"\nmedian |error| with the profile: {statistics.median(abs(e) for e in errors):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
