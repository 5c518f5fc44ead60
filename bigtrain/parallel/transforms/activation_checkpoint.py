"""Activation checkpointing of whole decoder blocks (``full``): keep only block inputs, recompute the rest in backward.

Each block is wrapped in place (non-reentrant ``torch.utils.checkpoint``). Applied before FSDP (torchtitan's order),
so FSDP's all-gather hooks sit outside the recomputed region and the parameters a recompute needs are the ones
backward has already gathered. The wrapper inserts ``_checkpoint_wrapped_module.`` into parameter names; ``rename``
takes it out again, so values, checkpoints and exports keep the HF names.
"""

from __future__ import annotations

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    _CHECKPOINT_PREFIX,
    CheckpointImpl,
    checkpoint_wrapper,
)

from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform


def _wrap_blocks(built: BuiltModel, ctx: BuildContext) -> None:
    for part in range(len(built.parts)):
        for index, block in enumerate(built.blocks(part)):
            wrapped = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False)
            built.replace_block(part, index, wrapped)


def hf_name(name: str) -> str:
    """A parameter's name without the wrapper's prefix."""
    return name.replace(_CHECKPOINT_PREFIX, "")


TRANSFORM = Transform(
    name="activation_checkpoint",
    wanted=lambda options: options.plan.activation_checkpointing != "none",
    apply=_wrap_blocks,
    rename=hf_name,
    planner_terms=("memory_terms.micro_batch_activations", "cost.estimate_time"),
)
