"""What a preference objective (``train.objective``: dpo, ipo, orpo, simpo) changes in a plan's memory and time.

A pair is two rows (its chosen and its rejected answer after one prompt): a plan of P pairs per step in
micro-batches of m pairs computes as a causal-LM plan of 2P rows in micro-batches of 2m (``as_rows``), which every
memory and time term already models. On top of that, dpo and ipo need the reference's log-probabilities
(``parallel.reference``, ``config/capabilities/preference.py``):
- adapter_disabled: no memory; one more forward of every row per step, the adapters switched off;
- sharded: the frozen copy's parameters (in the compute dtype; fp32 under DDP), sharded as the policy's (FSDP2 over
  dp_shard, ZeRO-3 over every rank, whole under DDP and ZeRO-1/2), resident for the run (the record's memory term);
  the same forward;
- offloaded: that copy in host memory, each micro-batch's forward first copying its shard in over PCIe;
- precomputed: no memory and no forward during training; one forward of every pair before the first step, whose
  cost per step is that forward's divided by the passes the run makes over its data (``Workload.epochs``).
The reference's forward runs before the policy's and keeps nothing for backward: it never adds to the peak beyond
its resident parameters. A forward is a third of a training step's matmuls (backward: two).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bigtrain.config.capabilities.preference import REFERENCE, copy_bytes, reference_mode
from bigtrain.config.plan import Plan
from bigtrain.config.schema import PREFERENCE_OBJECTIVES, rows_per_example
from bigtrain.config.workload import Workload

FORWARD_SHARE = 1.0 / 3.0  # of a step's matmuls: forward 2N, backward 4N FLOPs per token
LIVE = ("adapter_disabled", "sharded", "offloaded")


def as_rows(plan: Plan, workload: Workload) -> tuple[Plan, Workload]:
    """The causal-LM plan and workload a preference plan computes as (a pair: two rows); others unchanged."""
    per = rows_per_example(workload.objective)
    if per == 1:
        return plan, workload
    rows = dataclasses.replace(workload, global_batch_size=per * workload.global_batch_size, objective="sft")
    return plan.but(micro_batch_size=per * plan.micro_batch_size), rows


def reference_host_bytes(stats: Any, plan: Plan, workload: Workload) -> int:
    """The offloaded copy's share of host memory per GPU."""
    return copy_bytes(stats, plan, workload) if reference_mode(plan, workload) == "offloaded" else 0


def reference_seconds(stats: Any, plan: Plan, workload: Workload, compute_s: float, pcie_gbps: float) -> float:
    """Seconds per step the reference adds, given the step's compute over its rows (``compute_s``)."""
    mode = reference_mode(plan, workload)
    forward = FORWARD_SHARE * compute_s
    if mode == "precomputed":
        return forward / max(workload.epochs, 1e-9)
    if mode not in LIVE:
        return 0.0
    if mode == "offloaded":  # each micro-batch copies the shard in before its forward
        micro_batches = plan.grad_accum_steps(workload.global_batch_size)
        forward += micro_batches * reference_host_bytes(stats, plan, workload) / (pcie_gbps * 1e9)
    return forward


# what each reference costs, in the words of the plan table's note
COSTS = {
    "adapter_disabled": "the adapters switched off for one more forward per micro-batch; no memory",
    "sharded": "a frozen copy laid out as the policy's parameters, and one more forward per micro-batch",
    "offloaded": "that copy in host memory, copied in over PCIe for its forward each micro-batch",
    "precomputed": "one forward over every pair before step 1 (shared by the run's epochs); no memory, no forward "
    "during training",
}


def reference_note(choice: Any, runnable: list[Any], workload: Workload) -> list[str]:
    """dpo/ipo: the chosen reference, what it costs, and the best plan of each other reference (fitting or why not)."""
    workload = dataclasses.replace(workload, method=choice.method)  # train.method auto: the chosen method's
    chosen = reference_mode(choice.plan, workload)
    if chosen == "none":
        return []
    lines = [f"reference model: {chosen}: {COSTS[chosen]}"]
    best: dict[str, Any] = {}
    for c in runnable:  # best first: fitting by time, then the rest; of the chosen method (train.method auto)
        if c.method == choice.method:
            best.setdefault(reference_mode(c.plan, workload), c)
    for mode, c in best.items():
        if mode == chosen:
            continue
        if c.fits:
            gap = c.time.step_s / choice.time.step_s - 1
            verdict = f"{c.time.step_s:.3f} s/step ({gap:+.1%}), peak {c.memory.total_bytes / 2**30:.1f} GiB"
        else:
            verdict = f"no plan fits ({c.rejected_because})"
        lines.append(f"  with {mode}: {verdict}")
    if workload.epochs <= 1 and chosen != "precomputed" and "precomputed" in best:
        lines.append("  (precomputed saves the forward when the run passes over its pairs more than once: --epochs)")
    return lines


def batch_words(workload: Workload) -> str:
    """The global batch as the table's header says it: pairs (of two rows) for a preference objective."""
    if workload.objective not in PREFERENCE_OBJECTIVES:
        return str(workload.global_batch_size)
    rows = rows_per_example(workload.objective) * workload.global_batch_size
    return f"{workload.global_batch_size} pairs ({rows} rows)"


def one_reference_each(ranked: list[Any]) -> list[Any]:
    """The plan table's rows: each plan once, with its best reference (the note below the table gives the others);
    plans without a reference are all kept."""
    seen, out = set(), []
    for c in ranked:
        key = (c.plan.with_option(REFERENCE.name, REFERENCE.default), c.method, c.compile, c.fp8)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
