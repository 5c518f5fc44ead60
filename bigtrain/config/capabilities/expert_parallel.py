"""Expert parallelism (``parallel.ep``): a mixture's routed experts split over ep of the dp_shard ranks, tokens
dispatched to them by all-to-all (transformers' ``base_model_ep_plan``)."""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, Plan, SearchSpace, row
from bigtrain.config.plan import divisor_hint
from bigtrain.config.schema import ADAPTER_METHODS
from bigtrain.config.setup import Setup


def ep_needs_fsdp2(s: Setup) -> str | None:
    p = s.plan
    if p.ep > 1 and p.backend != "fsdp2":
        return (
            f"parallel.ep={p.ep} is built on backend fsdp2 (each expert sharded by FSDP2 over the dp_shard ranks ep "
            f"leaves), not {p.backend}; use backend fsdp2"
        )
    return None


def ep_with_tp_pp_or_cp(s: Setup) -> str | None:
    p = s.plan
    if p.ep == 1:  # (asked of every plan the planner weighs: the cheap test first)
        return None
    others = [f"{key}={getattr(p, key)}" for key in ("tp", "pp", "cp") if getattr(p, key) > 1]
    if others:
        return (
            f"parallel.ep={p.ep} with parallel.{' and parallel.'.join(others)} is not built yet; use ep with "
            "data parallelism alone (dp_shard, dp_replicate)"
        )
    return None


def ep_divides_dp_shard(s: Setup) -> str | None:
    p = s.plan
    if p.ep > 1 and p.dp_shard % p.ep:
        return (
            f"parallel.ep={p.ep} does not divide parallel.dp_shard={p.dp_shard} (the experts are split over ep of "
            f"the dp_shard ranks); try {divisor_hint(p.dp_shard)}"
        )
    return None


def ep_needs_experts(s: Setup) -> str | None:
    model = s.model
    if s.plan.ep == 1 or model is None:
        return None
    if not model.num_experts:
        return f"parallel.ep={s.plan.ep} splits a mixture's routed experts, and {model.model_type} has none; unset it"
    if not model.ep_layout:
        return (
            f"parallel.ep={s.plan.ep}: transformers ships no expert-parallel layout (base_model_ep_plan) for "
            f"{model.model_type}; unset it"
        )
    return None


def ep_divides_experts(s: Setup) -> str | None:
    model, ep = s.model, s.plan.ep
    if ep > 1 and model is not None and model.num_experts and model.num_experts % ep:
        return (
            f"parallel.ep={ep} does not divide the {model.num_experts} experts of {model.model_type}; try "
            f"{divisor_hint(model.num_experts)}"
        )
    return None


# the families where expert parallelism with selective checkpointing fails in backward: on DeepSeek-V3 torch's
# selective checkpointing replays the expert unit's FSDP2 post-forward and finds a record_function it did not store
# ("invocation index 2 encountered during backward but not found in storage"); Mixtral and Qwen3-MoE run it
# (tests/distributed/test_equivalence.py)
EP_SELECTIVE_FAILS = ("deepseek_v3",)


def ep_with_selective_on_some_families(s: Setup) -> str | None:
    model = s.model
    if s.plan.ep > 1 and s.plan.activation_checkpointing == "selective" and model is not None:
        if model.model_type in EP_SELECTIVE_FAILS:
            return (
                f"parallel.ep={s.plan.ep} with activation_checkpointing=selective is not built for "
                f"{model.model_type} yet (torch's selective checkpointing cannot replay its expert unit); use "
                "activation_checkpointing=full or none"
            )
    return None


def ep_with_hybrid_sharding(s: Setup) -> str | None:
    # found by tests/pairs.py's equivalence cases on Mixtral: with dp_replicate=2 x dp_shard=2 and ep=2 (each expert
    # on one rank of its replica, FSDP2's expert mesh dp_replicate x efsdp with efsdp=1) the first step's loss equals
    # the plain loop's and its gradient norm is 0.15% off (0.68871 against 0.68971), the same with or without
    # accumulation and in both reduction modes; dp_replicate=2 x dp_shard=4 with ep=2 (efsdp=2) equals the loop
    p = s.plan
    if p.ep > 1 and p.dp_replicate > 1 and p.dp_shard == p.ep:
        return (
            f"parallel.ep={p.ep} equal to parallel.dp_shard={p.dp_shard} with parallel.dp_replicate={p.dp_replicate} "
            "(hybrid sharding with each expert on one rank per replica) is not built yet; on these GPUs use "
            f"dp_replicate=1 with dp_shard={p.dp_replicate * p.dp_shard}, or on more GPUs a dp_shard that is a larger "
            f"multiple of ep (dp_shard={2 * p.ep})"
        )
    return None


def ep_with_adapters(s: Setup) -> str | None:
    # decided, not left open: peft wraps each expert's projections, which the expert-parallel split and its
    # all-to-all dispatch (transformers' grouped experts) do not see; no equivalence case runs it
    if s.plan.ep > 1 and s.train.method in ADAPTER_METHODS:
        return (
            f"parallel.ep={s.plan.ep} with train.method={s.train.method} is not built yet (the adapters would wrap "
            "expert projections that expert parallelism splits); use parallel.ep=1: FSDP2 shards the frozen "
            "experts instead"
        )
    return None


def _degrees(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    """For a mixture: each ep that divides dp_shard, within a node (the all-to-alls want the fastest links)."""
    if space.pinned("ep"):
        return [plan.but(ep=space.fixed["ep"]) for plan in plans]
    if not space.facts.num_experts:
        return plans
    more = [
        plan.but(ep=ep)
        for plan in plans
        for ep in range(2, min(plan.dp_shard, space.gpus_per_node) + 1)
        if plan.dp_shard % ep == 0
    ]
    return plans + more


CAPABILITY = Capability(
    name="expert_parallel",
    summary="expert parallelism: a mixture's experts split over ep of the dp_shard ranks, all-to-all dispatch",
    keys=("parallel.ep",),
    rules=(
        row(ep_needs_fsdp2, "not_built"),
        row(ep_with_tp_pp_or_cp, "not_built"),
        row(ep_with_hybrid_sharding, "not_built"),
        row(ep_with_adapters, "not_built"),
        row(ep_with_selective_on_some_families, "not_built", reads_model=True, reads_micro_batch=True),
        row(ep_divides_dp_shard, "fit"),
        row(ep_needs_experts, "fit", reads_model=True),
        row(ep_divides_experts, "fit", reads_model=True),
    ),
    variants=_degrees,
    transforms=("expert_parallel",),
)
