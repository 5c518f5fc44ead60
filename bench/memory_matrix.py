"""Analytic peak memory vs the simulated peak (bigtrain's own step on fake tensors, rank 0 of an N-rank job).

    python bench/memory_matrix.py            # prints the Markdown table recorded in bench/results/memory_matrix.md

The cases live in tests/cases.py: REAL_WIDTH_CASES (the widths users train, trimmed depth), MEMORY_CASES (narrow
models, many plan shapes) and PIPELINE_MEMORY_CASES (the simulated and the predicted peak are each the busiest pp
rank's); tests/distributed/test_real_width_memory.py and test_memory_matrix.py assert them within 10%.
DDP cases cannot run DDP's reducer on fake tensors: the simulator emulates its gradient buckets (one flat fp32
storage, see bigtrain/measure/simulate.py), so those rows check everything but the buckets; DDP's real reducer
was measured on a GPU instead (bench/results/rank0_h200.md, 1b-ddp-N8-full-accum2: -1.8%).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cases import (  # noqa: E402
    BF16_REAL_TENSOR_CASES,
    MEMORY_CASES,
    PIPELINE_MEMORY_CASES,
    REAL_WIDTH_CASES,
    MemoryCase,
    arch_config,
)

from bigtrain.measure.simulate import simulate  # noqa: E402
from bigtrain.planner.memory import estimate_memory  # noqa: E402
from bigtrain.planner.model_stats import ModelStats  # noqa: E402


def run_case(case: MemoryCase) -> tuple[int, int]:
    """(predicted peak bytes, simulated peak bytes)."""
    config = arch_config(case.arch)
    stats = ModelStats.from_config(config)
    predicted = estimate_memory(stats, case.plan(), case.workload()).total_bytes
    # loss_parallel: real tensors (fake ones over-count torch's vocabulary-parallel cross-entropy, see simulate.py)
    real = case.loss_parallel
    simulated = simulate(config, case.plan(), case.workload(), real_tensors=real)
    simulated = simulated["Total"]
    return predicted, simulated


def main() -> int:
    print(
        "| model | plan | N | ac | mb | seq | batch | accum | grads between micro-steps | dtype "
        "| predicted MiB | simulated MiB | error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    start = time.perf_counter()
    cases = REAL_WIDTH_CASES + MEMORY_CASES + PIPELINE_MEMORY_CASES + BF16_REAL_TENSOR_CASES
    for c in cases:
        predicted, simulated = run_case(c)
        err = predicted / simulated - 1
        worst = max(worst, abs(err))
        plan = "ddp" if c.backend == "ddp" else f"fsdp2 zero{c.zero_stage}" + (f" tp{c.tp}" if c.tp > 1 else "")
        plan = plan if c.method == "full" else f"{c.method} {plan}"
        plan += f" (+{', '.join(c.modules_to_save)} trained fully)" if c.modules_to_save else ""
        plan += f" cp{c.cp}" if c.cp > 1 else ""
        plan += f" every {c.every}" if c.every > 1 else ""
        plan += f" chunked loss {c.loss_chunk}" if c.loss_chunk else ""
        plan += " offload act" if c.offload else ""
        plan += " loss_parallel" if c.loss_parallel else ""
        plan += " sequence_parallel" if c.sequence_parallel else ""
        if c.pp > 1:
            plan += f" pp{c.pp} {c.pp_schedule}" + (f" x{c.pp_virtual_stages}" if c.pp_virtual_stages > 1 else "")
        world = f"{c.replicate}x{c.world // c.replicate}" if c.replicate > 1 else str(c.world)  # ranks (tp included)
        if c.accum == 1:
            grads = "-"
        elif c.backend == "ddp":
            grads = "DDP buckets (emulated)"
        else:
            grads = "sharded" if c.grad_reduce == "every_micro_step" else "unsharded"
        print(
            f"| {c.arch} | {plan} | {world} | {c.ac} | {c.micro_batch} | {c.seq_len} | {c.global_batch} | {c.accum} "
            f"| {grads} | {c.precision} | {predicted / 2**20:,.1f} | {simulated / 2**20:,.1f} | {err:+.1%} |",
            flush=True,
        )
    print(f"\nworst |error| {worst:.1%} over {len(cases)} cases in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
