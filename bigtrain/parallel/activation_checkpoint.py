"""Activation checkpointing of whole decoder blocks (``full``): keep only block inputs, recompute the rest in backward.

Applied before FSDP (torchtitan's order), so FSDP's all-gather hooks sit outside the recomputed region and the
parameters a recompute needs are the ones backward has already gathered.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper


def apply_activation_checkpoint(blocks: list[tuple[nn.Module, str, nn.Module]], mode: str) -> list[nn.Module]:
    """Wrap each block in place (non-reentrant torch.utils.checkpoint) and return the blocks now in the model."""
    if mode == "none":
        return [block for _, _, block in blocks]
    wrapped = []
    for parent, attr, block in blocks:
        new = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False)
        setattr(parent, attr, new)  # ModuleList accepts setattr with its string index
        wrapped.append(new)
    return wrapped
