"""The planner's step time against bigtrain's measured step, on 2 CPU gloo ranks, with and without a probed profile.

    python bench/step_time.py            # probes this machine first (bigtrain probe --nproc 2), ~8 minutes
    python bench/step_time.py --profile bench/results/cpu_probe.json

For each plan, ``bigtrain train --nproc 2`` runs a Llama of width 512 (4 blocks, 2k vocabulary, 256 tokens, global
batch 8, fp32) for a few steps; a run's step time is the median over its steps after the first two (the first pay
start-up), and the measured figure the median over ``--reps`` rounds that alternate the plans. Predicted:
``planner/cost.py`` with the profile's measured rates and link (``planner/profile.py``), and with the built-in CPU
stand-in of ``plan: auto`` (0.5 TFLOP/s, 10 GB/s), which is what the planner used before. Prints the Markdown table
recorded in ``bench/results/step_time_cpu.md``; ``--measured FILE`` keeps the measured times (the plot reads them).
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


def predict(name: str, profile_path: str | None) -> float:
    """The planner's seconds per step for plan ``name`` on 2 ranks: with a probe profile, or (None) with the built-in
    CPU stand-in of ``plan: auto``."""
    from bigtrain.config.resolve import resolve_plan
    from bigtrain.config.schema import ParallelConfig, TrainConfig
    from bigtrain.config.workload import Workload
    from bigtrain.planner.auto import CPU
    from bigtrain.planner.cost import estimate_time
    from bigtrain.planner.hardware import Cluster
    from bigtrain.planner.model_stats import ModelStats
    from bigtrain.planner.profile import gpu_from_profile, load_profile

    gpu = CPU
    if profile_path is not None:
        gpu = gpu_from_profile(load_profile(profile_path), replace(CPU, memory_bytes=8 * 2**30))
    plan = resolve_plan(ParallelConfig(**PLANS[name]), 2, TrainConfig(global_batch_size=BATCH))
    workload = Workload(seq_len=SEQ, global_batch_size=BATCH, mixed_precision="fp32")
    return estimate_time(ModelStats.from_config(MODEL), plan, Cluster(gpu, 2, 2), workload).step_s


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", help="a bigtrain probe profile of this machine (default: probe it now)")
    parser.add_argument("--reps", type=int, default=2, help="rounds over all plans, alternating (default 2)")
    parser.add_argument(
        "--measured",
        help="a JSON of measured seconds per plan: read it if it exists (only predict), else measure and write it",
    )
    args = parser.parse_args()
    from bigtrain.planner.profile import load_profile

    with tempfile.TemporaryDirectory() as tmp:
        profile_path = args.profile
        if profile_path is None:
            profile_path = str(Path(tmp) / "profile.json")
            cmd = [sys.executable, "-m", "bigtrain", "probe", "--nproc", "2", "-o", profile_path]
            subprocess.run(cmd, check=True, capture_output=True, cwd=REPO, timeout=300)
        profile = load_profile(profile_path)
        print(f"profile: {profile['device']}, torch {profile['torch']}, {profile['date']}")
        print()
        print("| plan | measured s/step | predicted (profile) | error | predicted (built-in CPU) | error |")
        print("|---|---|---|---|---|---|")
        errors = []
        recorded = json.loads(Path(args.measured).read_text()) if args.measured and Path(args.measured).exists() else {}
        if not recorded:  # every plan once per round, rounds alternating, so that a slow minute hits all plans alike
            rounds: dict[str, list[float]] = {name: [] for name in PLANS}
            for rep in range(args.reps):
                for name, parallel in PLANS.items():
                    folder = Path(tmp) / f"{name.replace(' ', '_').replace('=', '')}-{rep}"
                    folder.mkdir()
                    rounds[name].append(run(parallel, folder))
            recorded = {name: statistics.median(times) for name, times in rounds.items()}
            print(f"rounds: {json.dumps(rounds)}\n", flush=True)
        for name in PLANS:
            measured = recorded[name]
            with_profile = predict(name, profile_path)
            built_in = predict(name, None)
            errors.append(with_profile / measured - 1)
            print(
                f"| {name} | {measured:.3f} | {with_profile:.3f} | {with_profile / measured - 1:+.0%} "
                f"| {built_in:.3f} | {built_in / measured - 1:+.0%} |",
                flush=True,
            )
        print(f"\nmedian |error| with the profile: {statistics.median(abs(e) for e in errors):.0%}")
        if args.measured and not Path(args.measured).exists():
            Path(args.measured).write_text(json.dumps(recorded, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
