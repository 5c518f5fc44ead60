"""The reference model (``parallel.reference``): a role of the objectives measured against the policy as training
starts (dpo, ipo: their specs list the role ``reference``), placed by the plan like any other dimension.

Where its log-probabilities come from (``roles/reference.py`` runs them):
- ``adapter_disabled``: LoRA/QLoRA's own frozen base, the adapters switched off for one forward: no memory, one more
  forward of every row per step;
- ``sharded``: a frozen copy built by the one build path, laid out as the policy's parameters (sharded under FSDP2
  and ZeRO-3, whole under DDP and ZeRO-1/2), in the compute dtype (fp32 under DDP, whose policy computes from fp32
  weights under autocast), resident for the run; the same forward;
- ``offloaded``: that copy in host memory (FSDP2's CPU offload), each micro-batch's forward first copying its shard
  in over PCIe;
- ``precomputed``: one forward of every pair before the first step (``roles/reference_pass.py``), stored beside the
  run: no memory and no forward during training; its cost per step is that forward's divided by the passes the run
  makes over its data (``Workload.epochs``).
The reference's forward runs before the policy's and keeps nothing for backward: it never adds to the peak beyond
its resident parameters. A forward is a third of a training step's matmuls (backward: two).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bigtrain.config.capabilities.table import Capability, Option, SearchSpace, row
from bigtrain.config.plan import Plan
from bigtrain.config.schema import ADAPTER_METHODS
from bigtrain.config.setup import Setup

ROLE = "reference"  # the role an objective's spec names (``ObjectiveSpec.roles``)
REFERENCES = ("auto", "adapter_disabled", "sharded", "offloaded", "precomputed")
REFERENCE = Option(
    "reference",
    "auto",
    "dpo/ipo: where the reference model's log-probabilities come from: adapter_disabled (LoRA/QLoRA's base with the "
    "adapters off: no memory, one more forward per micro-batch), sharded (a frozen copy laid out as the policy: "
    "sharded under FSDP2/ZeRO-3, whole under DDP/ZeRO-1/2), offloaded (that copy in host memory, "
    "FSDP2), precomputed (one forward pass over the data before training, stored in output_dir and reused on "
    "resume); auto: adapter_disabled with adapters, else sharded (plan: auto weighs them all).",
)
FORWARD_SHARE = 1.0 / 3.0  # of a step's matmuls: forward 2N, backward 4N FLOPs per token
LIVE = ("adapter_disabled", "sharded", "offloaded")


def resolved_reference(plan: Plan, roles: tuple[str, ...], method: str) -> str:
    """The reference a plan uses for a job with these ``roles`` trained by ``method``: none for a job without one,
    auto resolved."""
    if ROLE not in roles:
        return "none"
    mode = REFERENCE.of(plan)
    if mode != "auto":
        return mode
    return "adapter_disabled" if method in ADAPTER_METHODS else "sharded"


def reference_mode(plan: Plan, workload: Any) -> str:
    """``resolved_reference`` for the planner's workload (asked for every candidate: no recipe section is made)."""
    return resolved_reference(plan, workload.job.roles, workload.method)


def shards_of(plan: Plan) -> int:
    """Over how many ranks the frozen copy's parameters are split: the policy's own sharding."""
    if plan.backend == "fsdp2":
        return plan.dp_shard * plan.cp
    if plan.backend == "deepspeed" and plan.zero_stage == 3:
        return plan.dp
    return 1


def copy_bytes(stats: Any, plan: Plan, workload: Any) -> int:
    """The frozen copy's parameters on one device, sharded as the policy's: in the compute dtype, but fp32 under DDP
    (whose policy computes from fp32 weights under autocast, ``parallel/build.py``)."""
    value = 4 if plan.backend == "ddp" else workload.dtype_bytes
    return stats.params * value // shards_of(plan)


def reference_bytes(stats: Any, plan: Plan, workload: Any) -> int:
    """The memory term: the frozen copy (``sharded``), resident for the run; no other reference keeps anything on the
    device at the peak."""
    return copy_bytes(stats, plan, workload) if reference_mode(plan, workload) == "sharded" else 0


def reference_host_bytes(stats: Any, plan: Plan, workload: Any) -> int:
    """The offloaded copy's share of host memory per GPU."""
    return copy_bytes(stats, plan, workload) if reference_mode(plan, workload) == "offloaded" else 0


def reference_seconds(stats: Any, plan: Plan, cluster: Any, workload: Any, compute_s: float) -> float:
    """Seconds per step the reference adds, given the step's compute over its rows (``compute_s``)."""
    mode = reference_mode(plan, workload)
    forward = FORWARD_SHARE * compute_s
    if mode == "precomputed":
        return forward / max(workload.epochs, 1e-9)
    if mode not in LIVE:
        return 0.0
    if mode == "offloaded":  # each micro-batch copies the shard in before its forward
        micro_batches = plan.grad_accum_steps(workload.global_batch_size)
        forward += micro_batches * reference_host_bytes(stats, plan, workload) / (cluster.gpu.pcie_gbps * 1e9)
    return forward


# what each reference costs, in the words of the plan table's note
COSTS = {
    "adapter_disabled": "the adapters switched off for one more forward per micro-batch; no memory",
    "sharded": "a frozen copy laid out as the policy's parameters, and one more forward per micro-batch",
    "offloaded": "that copy in host memory, copied in over PCIe for its forward each micro-batch",
    "precomputed": "one forward over every pair before step 1 (shared by the run's epochs); no memory, no forward "
    "during training",
}


def reference_note(choice: Any, runnable: list[Any], workload: Any) -> list[str]:
    """The chosen reference, what it costs, and the best plan of each other reference (fitting or why not)."""
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


def _has_role(s: Setup) -> bool:
    return s.job is not None and ROLE in s.job.roles


def _reference_value(s: Setup) -> str | None:
    mode = REFERENCE.of(s.plan)
    if mode in REFERENCES:
        return None
    return f"parallel.reference={mode!r} is not a reference; use one of {', '.join(REFERENCES)}"


def _reference_without_its_objective(s: Setup) -> str | None:
    mode = REFERENCE.of(s.plan)
    if mode == "auto" or s.job is None or ROLE in s.job.roles:
        return None
    return (
        f"parallel.reference={mode}: train.objective={s.job.objective} has no reference model (dpo and ipo do); "
        "leave parallel.reference=auto"
    )


def _reference_against_the_method(s: Setup) -> str | None:
    if not _has_role(s):
        return None
    mode, method = REFERENCE.of(s.plan), s.train.method
    if mode == "adapter_disabled" and method not in (*ADAPTER_METHODS, "auto"):
        return (
            f"parallel.reference=adapter_disabled needs adapters to switch off, and train.method={method} trains "
            "every parameter; set train.method=lora, or parallel.reference=sharded, offloaded or precomputed"
        )
    if mode in ("sharded", "offloaded") and method in ADAPTER_METHODS:
        return (
            f"parallel.reference={mode} with train.method={method}: the frozen base already is the reference, at no "
            "memory cost; use parallel.reference=adapter_disabled (or precomputed)"
        )
    return None


def _offloaded_reference_engines(s: Setup) -> str | None:
    if not _has_role(s) or s.plan.backend == "fsdp2" or REFERENCE.of(s.plan) != "offloaded":
        return None
    return (
        f"parallel.reference=offloaded with backend {s.plan.backend} is not built yet (FSDP2's CPU offload holds it); "
        "use backend fsdp2, or parallel.reference=sharded or precomputed"
    )


def _reference_variants(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    """Each plan with every reference the job may use (the adapter-disabled base, unless lora.modules_to_save
    trains modules fully, or the precomputed pass with adapters; the sharded copy, the offloaded one, or the
    precomputed pass without); a pinned one is set. The rows refuse the rest; the ranking weighs memory against the
    forward each live reference adds per step."""
    if space.pinned(REFERENCE.name):
        return [plan.with_option(REFERENCE.name, space.fixed[REFERENCE.name]) for plan in plans]
    if ROLE not in space.job.roles:
        return plans
    adapters = space.method in ADAPTER_METHODS
    modes = ("adapter_disabled", "precomputed") if adapters else ("sharded", "offloaded", "precomputed")
    if adapters and space.modules_to_save:  # modules trained fully: the adapters switched off are not the start
        modes = ("precomputed",)
    return [plan.with_option(REFERENCE.name, mode) for plan in plans for mode in modes]


CAPABILITY = Capability(
    name="reference",
    summary="the reference model of dpo and ipo as a plan choice",
    rules=(
        row(_reference_value, "invalid"),
        row(_reference_without_its_objective, "invalid", reads_job=True),
        row(_reference_against_the_method, "invalid", reads_job=True),
        row(_offloaded_reference_engines, "not_built", reads_job=True),
    ),
    options=(REFERENCE,),
    variants=_reference_variants,
    memory=reference_bytes,
    time=reference_seconds,
    host=reference_host_bytes,
    explain=reference_note,
)
