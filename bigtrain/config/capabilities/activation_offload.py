"""Activation offload (``parallel.offload_activations``): what each decoder block saves for backward waits in host
memory, copied on a side stream."""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, Plan, SearchSpace, row
from bigtrain.config.setup import Setup

# rows (per cp rank) at least this long get activation offload weighed: below it a block's compute does not hide
# the copy of what it saves (without checkpointing, ~34 bytes per token and hidden unit against ~24 FLOPs)
OFFLOAD_MIN_SEQ_LEN = 16384


def offload_activations_with_selective(s: Setup) -> str | None:
    if s.plan.offload_activations and s.plan.activation_checkpointing == "selective":
        return (
            "parallel.offload_activations=true with activation_checkpointing=selective is not built: what selective "
            "keeps sits in torch's checkpoint cache, which the offload cannot move; use full (offloads each block's "
            "input) or none (offloads everything a block saves)"
        )
    return None


def offload_activations_with_pp(s: Setup) -> str | None:
    if s.plan.offload_activations and s.plan.pp > 1:
        return (
            "parallel.offload_activations=true with parallel.pp > 1 is not built yet (a schedule interleaves the "
            "micro-batches' blocks, which its fetch-ahead does not follow); use activation_checkpointing instead"
        )
    return None


def offload_activations_with_tp(s: Setup) -> str | None:
    # found when the search stopped leaving tp out of the offload variants by a condition no row stated: a tp2 plan
    # with offload fails in its first backward (torch 2.13: "as_strided not supported with DTensor")
    if s.plan.offload_activations and s.plan.tp > 1:
        return (
            f"parallel.offload_activations=true with parallel.tp={s.plan.tp} is not built yet (what tp's blocks save "
            "for backward includes DTensor views, which the offload cannot restore); use activation_checkpointing "
            "instead, or tp=1"
        )
    return None


def _offloaded(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    """Weighed for long rows, where the block inputs of full checkpointing or all a block saves do not fit."""
    if space.pinned("offload_activations"):
        return [p.but(offload_activations=space.fixed["offload_activations"]) for p in plans]
    return plans + [p.but(offload_activations=True) for p in plans if space.seq_len // p.cp >= OFFLOAD_MIN_SEQ_LEN]


CAPABILITY = Capability(
    name="activation_offload",
    summary="activation offload: what the blocks save waits in pinned host memory, copied on a side stream",
    keys=("parallel.offload_activations",),
    rules=(
        row(offload_activations_with_selective, "not_built", reads_micro_batch=True),
        row(offload_activations_with_pp, "not_built"),
        row(offload_activations_with_tp, "not_built"),
    ),
    variants=_offloaded,
    transforms=("activation_offload",),
)
