"""Preference objectives (``train.objective``: dpo, ipo, orpo, simpo) and the reference model as a plan dimension.

dpo and ipo measure the policy against a reference model (the policy as training starts); ``parallel.reference``
says where its log-probabilities come from (``engine/reference.py``): the adapter-disabled base (LoRA/QLoRA), a frozen
copy sharded like the policy or offloaded to host memory, or a pass over the data before training (precomputed).
orpo and simpo need none. The objectives run on the data-parallel plans (DDP, FSDP2, HSDP, DeepSpeed ZeRO, with
activation checkpointing, adapters): everything that splits a sequence, the vocabulary or the layers is a row.
"""

from __future__ import annotations

from typing import Any

from bigtrain.config.capabilities.table import Capability, Option, SearchSpace, row, split_settings
from bigtrain.config.plan import Plan
from bigtrain.config.schema import ADAPTER_METHODS, PREFERENCE_OBJECTIVES, REFERENCE_OBJECTIVES, TrainConfig
from bigtrain.config.setup import Setup
from bigtrain.config.workload import Workload

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


def reference_of(plan: Plan, train: TrainConfig) -> str:
    """The reference a plan uses for ``train.objective``: none for objectives without one, auto resolved."""
    return resolved_reference(plan, train.objective, train.method)


def resolved_reference(plan: Plan, objective: str, method: str) -> str:
    if objective not in REFERENCE_OBJECTIVES:
        return "none"
    mode = REFERENCE.of(plan)
    if mode != "auto":
        return mode
    return "adapter_disabled" if method in ADAPTER_METHODS else "sharded"


def reference_mode(plan: Plan, workload: Workload) -> str:
    """``reference_of`` for the planner's workload (asked for every candidate: no recipe section is made)."""
    return resolved_reference(plan, workload.objective, workload.method)


def shards_of(plan: Plan) -> int:
    """Over how many ranks the frozen copy's parameters are split: the policy's own sharding."""
    if plan.backend == "fsdp2":
        return plan.dp_shard * plan.cp
    if plan.backend == "deepspeed" and plan.zero_stage == 3:
        return plan.dp
    return 1


def copy_bytes(stats: Any, plan: Plan, workload: Workload) -> int:
    """The frozen copy's parameters on one device, sharded as the policy's: in the compute dtype, but fp32 under DDP
    (whose policy computes from fp32 weights under autocast, ``parallel/build.py``)."""
    value = 4 if plan.backend == "ddp" else workload.dtype_bytes
    return stats.params * value // shards_of(plan)


def reference_bytes(stats: Any, plan: Plan, workload: Workload) -> int:
    """The memory term: the frozen copy (``sharded``), resident for the run; no other reference keeps anything on the
    device at the peak (their forward runs before the policy's, keeping nothing for backward:
    ``planner/preference.py``)."""
    return copy_bytes(stats, plan, workload) if reference_mode(plan, workload) == "sharded" else 0


def _preference(s: Setup) -> bool:
    return s.train.objective in PREFERENCE_OBJECTIVES


def _reference_value(s: Setup) -> str | None:
    if s.train.objective not in REFERENCE_OBJECTIVES:  # any value is refused by the next row then
        return None
    mode = REFERENCE.of(s.plan)
    if mode in REFERENCES:
        return None
    return f"parallel.reference={mode!r} is not a reference; use one of {', '.join(REFERENCES)}"


def _reference_without_its_objective(s: Setup) -> str | None:
    mode = REFERENCE.of(s.plan)
    if mode == "auto" or s.train.objective in REFERENCE_OBJECTIVES:
        return None
    return (
        f"parallel.reference={mode}: train.objective={s.train.objective} has no reference model (dpo and ipo do); "
        "leave parallel.reference=auto"
    )


def _reference_against_the_method(s: Setup) -> str | None:
    if s.train.objective not in REFERENCE_OBJECTIVES:
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


def _preference_with_model_parallelism(s: Setup) -> str | None:
    if not _preference(s):
        return None
    p = s.plan
    sync = next((value for name, value in p.options if name == "sync"), "every_step")
    for key, value, default in (*split_settings(p), ("sync", sync, "every_step")):
        if value != default:
            return (
                f"parallel.{key}={str(value).lower()} with train.objective={s.train.objective} is not built yet "
                f"(the objective compares whole answers of a pair on one rank); set parallel.{key}="
                f"{str(default).lower()} and shard with FSDP2 or DeepSpeed ZeRO-3"
            )
    return None


def _offloaded_reference_engines(s: Setup) -> str | None:
    if s.train.objective not in REFERENCE_OBJECTIVES or s.plan.backend == "fsdp2":
        return None
    if REFERENCE.of(s.plan) != "offloaded":
        return None
    return (
        f"parallel.reference=offloaded with backend {s.plan.backend} is not built yet (FSDP2's CPU offload holds it); "
        "use backend fsdp2, or parallel.reference=sharded or precomputed"
    )


def without_log_probabilities(objective: str, task: str) -> str:
    """What a preference objective on a model without log-probabilities is told (start-up says it before reading
    the data, which it would read as pairs)."""
    return (
        f"train.objective={objective} compares the log-probabilities of two answers, which a {task} model does not "
        "give; use a causal LM, or train.objective=sft"
    )


def _objective_needs_log_probabilities(s: Setup) -> str | None:
    if not _preference(s) or s.model is None or s.model.task == "causal-lm":
        return None
    return without_log_probabilities(s.train.objective, s.model.task)


def _reference_variants(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    """dpo/ipo: each plan with every reference it may use (the adapter-disabled base, unless lora.modules_to_save
    trains modules fully, or the precomputed pass with adapters; the sharded copy, the offloaded one, or the
    precomputed pass without); a pinned one is set.
    The rows refuse the rest; the ranking weighs memory against the forward each live reference adds per step."""
    if space.pinned(REFERENCE.name):
        return [plan.with_option(REFERENCE.name, space.fixed[REFERENCE.name]) for plan in plans]
    if space.objective not in REFERENCE_OBJECTIVES:
        return plans
    adapters = space.method in ADAPTER_METHODS
    modes = ("adapter_disabled", "precomputed") if adapters else ("sharded", "offloaded", "precomputed")
    if adapters and space.modules_to_save:  # modules trained fully: the adapters switched off are not the start
        modes = ("precomputed",)
    return [plan.with_option(REFERENCE.name, mode) for plan in plans for mode in modes]


CAPABILITY = Capability(
    name="preference",
    summary="preference objectives (train.objective dpo, ipo, orpo, simpo) with the reference model as a plan choice",
    keys=("train.objective", "train.beta", "train.loss_type", "train.simpo_gamma", "data.max_prompt_length"),
    rules=(
        row(_reference_value, "invalid"),
        row(_reference_without_its_objective, "invalid"),
        row(_reference_against_the_method, "invalid"),
        row(_objective_needs_log_probabilities, "invalid", reads_model=True),
        row(_preference_with_model_parallelism, "not_built"),
        row(_offloaded_reference_engines, "not_built"),
    ),
    options=(REFERENCE,),
    variants=_reference_variants,
    memory=reference_bytes,
)
