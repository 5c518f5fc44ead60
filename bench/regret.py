"""Planner regret: the planner's pick against the measured best of every plan that fits, on 2 CPU gloo ranks.

    python bench/regret.py                   # ~7 minutes on 2 cores: the table of results/regret_cpu.md

The model and data of bench/step_time.py (a Llama of width 512, 4 blocks, 2k vocabulary, 256 tokens, global batch
8, fp32) with a memory budget per rank (``--gpu-memory``, default 1.81 GiB, of which the planner keeps 1.5 GiB as
its fixed margin for a CUDA context and NCCL) small enough that some plans do not fit
and large enough that several do. The grid: backend (ddp, fsdp2 ZeRO-2 and ZeRO-3, DeepSpeed ZeRO-2) x micro-batch
(1, 4) x checkpointing (none, full). The planner predicts every plan with this machine's probe profile
(``bench/results/cpu_probe.json``) and ranks them as ``plan: auto`` would; every plan it says fits is then trained
for a few steps with ``bigtrain train --nproc 2`` (plans in random order, so that a slow minute does not fall on one
kind), and the pick's measured step time is compared with the fastest measured. Memory: the planner's peak against
bigtrain's own step simulated on fake tensors (``bigtrain plan --simulate``'s measure; DeepSpeed's step cannot be
simulated, see results/deepspeed_memory.md for its real step).
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_time import BATCH, MODEL, SEQ, run  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BACKENDS = [("ddp", 0), ("fsdp2", 2), ("fsdp2", 3), ("deepspeed", 2)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu-memory", default="1.81GiB", help="memory budget per rank (default 1.81GiB)")
    parser.add_argument("--profile", default=str(RESULTS / "cpu_probe.json"))
    args = parser.parse_args()
    from bigtrain.config.resolve import resolve_plan
    from bigtrain.config.schema import ParallelConfig, TrainConfig
    from bigtrain.config.workload import Workload
    from bigtrain.measure.simulate import simulate
    from bigtrain.planner.auto import CPU
    from bigtrain.planner.hardware import Cluster, parse_memory
    from bigtrain.planner.model_stats import ModelStats
    from bigtrain.planner.profile import gpu_from_profile, load_profile
    from bigtrain.planner.ranking import rank as _rank
    from bigtrain.planner.search import search

    stats = ModelStats.from_config(MODEL)
    gpu = gpu_from_profile(load_profile(args.profile), replace(CPU, memory_bytes=parse_memory(args.gpu_memory)))
    cluster = Cluster(gpu, 2, 2)
    grid = []
    for (backend, stage), micro, ac in itertools.product(BACKENDS, (1, 4), ("none", "full")):
        parallel = {"backend": backend, "zero_stage": stage, "micro_batch_size": micro, "activation_checkpointing": ac}
        grid.append((parallel, resolve_plan(ParallelConfig(**parallel), 2, TrainConfig(global_batch_size=BATCH))))
    # the planner's view of exactly this grid: its predictions and its ranking (plan: auto's rule, near ties included)
    ranked = search(stats, cluster, Workload(seq_len=SEQ, global_batch_size=BATCH, mixed_precision="fp32"))
    by_plan = {c.plan: c for c in ranked}
    candidates = [(parallel, by_plan[plan]) for parallel, plan in grid]
    fitting = [(p, c) for p, c in candidates if c.fits]
    chosen = _rank([c for _, c in fitting])[0]  # plan: auto's rule over this grid: fastest, simplest on near ties
    pick = next(pc for pc in fitting if pc[1] is chosen)
    measured: dict[int, float] = {}
    shuffled = list(range(len(fitting)))
    random.Random(0).shuffle(shuffled)
    with tempfile.TemporaryDirectory() as tmp:
        for i in shuffled:
            folder = Path(tmp) / str(i)
            folder.mkdir()
            measured[i] = run(fitting[i][0], folder)
            print(f"measured {i}: {measured[i]:.3f} s", file=sys.stderr, flush=True)
    best = min(measured.values())
    print(f"budget {args.gpu_memory} per rank, 2 CPU gloo ranks, profile {args.profile}")
    print(f"{len(grid)} plans in the grid, {len(fitting)} fit by the planner's prediction\n")
    print("| plan | predicted peak MiB | simulated peak MiB | predicted s/step | measured s/step | vs fastest |")
    print("|---|---|---|---|---|---|")
    for i, (parallel, c) in sorted(enumerate(fitting), key=lambda ic: measured[ic[0]]):
        name = f"{parallel['backend']} zero{parallel['zero_stage']} mb{parallel['micro_batch_size']}"
        name += f" ac={parallel['activation_checkpointing']}"
        sim = "-"
        if parallel["backend"] != "deepspeed":
            peak = simulate(MODEL, c.plan, Workload(seq_len=SEQ, global_batch_size=BATCH, mixed_precision="fp32"))
            sim = f"{peak['Total'] / 2**20:,.0f}"
        mark = " **(pick)**" if c is pick[1] else ""
        print(
            f"| {name}{mark} | {c.memory.total_bytes / 2**20:,.0f} | {sim} | {c.time.step_s:.3f} "
            f"| {measured[i]:.3f} | {measured[i] / best - 1:+.0%} |"
        )
    for parallel, c in candidates:
        if not c.fits:
            print(f"| {parallel} | {c.memory.total_bytes / 2**20:,.0f} | | | | does not fit: {c.rejected_because} |")
    regret = measured[fitting.index(pick)] / best - 1
    print(f"\nregret of the pick: {regret:+.1%} (measured step of the pick over the fastest measured)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
