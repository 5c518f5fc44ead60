"""Activation checkpointing (``parallel.activation_checkpointing``: none, selective, full; ``checkpoint_every``): what
the decoder blocks keep for backward, traded for recomputation."""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, Plan, SearchSpace


def _every_other_block(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    """Full checkpointing of every other block, between none and full in memory and in time; weighed without tp and
    pp (where rows are long and memory is activations, not model states) for models of 4 or more blocks."""
    if space.pinned("checkpoint_every"):
        every = space.fixed["checkpoint_every"]
        return [p.but(checkpoint_every=every) for p in plans] if every > 1 else plans
    if space.facts.layers < 4:
        return plans
    more = [p for p in plans if p.activation_checkpointing == "full" and p.tp == p.pp == 1]
    return plans + [p.but(checkpoint_every=2) for p in more]


CAPABILITY = Capability(
    name="activation_checkpointing",
    summary="activation checkpointing: selective (per op), full, or full on every k-th block",
    keys=("parallel.activation_checkpointing", "parallel.checkpoint_every"),
    variants=_every_other_block,
    transforms=("activation_checkpoint",),
)
