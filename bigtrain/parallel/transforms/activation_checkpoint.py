"""Activation checkpointing of decoder blocks: keep less for backward, recompute the rest.

- ``full``: each checkpointed block keeps only its input; backward reruns its forward.
- ``selective`` (per op, torch's selective-checkpoint API): each checkpointed block keeps the outputs of its matmuls
  and of attention (``SAVED_OPS``: the expensive ones to redo) and recomputes the element-wise ops between them
  (norms, RoPE, the activation function, residual adds), which are cheap in FLOPs but many in bytes.
- ``parallel.checkpoint_every: k``: only every k-th block (0, k, 2k, ...) is checkpointed, the others keep all
  their activations: the step between none and all.

Each chosen block is wrapped in place (non-reentrant ``torch.utils.checkpoint``). Applied before FSDP (torchtitan's
order), so FSDP's all-gather hooks sit outside the recomputed region and the parameters a recompute needs are the
ones backward has already gathered. The wrapper inserts ``_checkpoint_wrapped_module.`` into parameter names;
``rename`` takes it out again, so values, checkpoints and exports keep the HF names.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    _CHECKPOINT_PREFIX,
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform

_aten = torch.ops.aten
# what selective checkpointing keeps: matmul outputs (every projection) and attention's outputs (each SDPA kernel
# returns its output with the log-sum-exp its backward needs)
SAVED_OPS = frozenset(
    op
    for op in (
        _aten.mm.default,
        _aten.addmm.default,
        _aten.bmm.default,
        _aten._scaled_mm.default,  # train.fp8's float8 matmuls on CUDA (emulation runs mm)
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
        getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu", None)
        and _aten._scaled_dot_product_flash_attention_for_cpu.default,
    )
    if op
)


def _keep_matmuls_and_attention(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def checkpointed_blocks(layers: int, every: int) -> list[int]:
    """The indices of the blocks a plan checkpoints: every ``every``-th, from the first."""
    return list(range(0, layers, every))


def _wrap_blocks(built: BuiltModel, ctx: BuildContext) -> None:
    plan = built.plan
    kwargs: dict[str, Any] = {}
    if plan.activation_checkpointing == "selective":
        kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, _keep_matmuls_and_attention)
    for part in range(len(built.parts)):
        blocks = built.blocks(part)
        for index in checkpointed_blocks(len(blocks), plan.checkpoint_every):
            # a block with active dropout recomputes with the random state of its forward (else backward would
            # differentiate other masks than the forward applied: a classifier's BERT keeps 0.1 by default)
            dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in blocks[index].modules())
            wrapped = checkpoint_wrapper(
                blocks[index], checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=dropout, **kwargs
            )
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
