"""The capability table's rows about expert parallelism (``parallel.ep``): what it needs of the plan and the model.

``capabilities.py`` lists them in ``RULES`` with the rest; each returns the one line a user gets, or None.
"""

from __future__ import annotations

from bigtrain.config.plan import divisor_hint
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
