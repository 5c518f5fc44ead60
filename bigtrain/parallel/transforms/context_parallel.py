"""Context parallelism (``parallel.cp``), DeepSpeed-Ulysses' form: each row's sequence is split into cp contiguous
slices, one per rank of a cp group, and around every attention the ranks trade heads for sequence.

- **Attention**: registered in transformers' attention interface (``ULYSSES``), so no model code is patched: the
  model's attention modules call it as they would call sdpa. It all-to-alls q, k and v from (all heads, this rank's
  slice of the sequence) to (1/cp of the heads, the whole sequence), runs the recipe's attention (sdpa or flash) on
  that, which is exact causal attention over the whole row for those heads, and all-to-alls the output back. The
  all-to-all is torch's autograd-aware functional collective, so backward runs the reverse exchange.
- **What the transform changes**: each attention module learns its cp group and the attention it wraps
  (attributes read by ``ulysses_attention``), and the model's config names ``ULYSSES``; with a custom attention
  transformers builds no mask (causality comes from the full-sequence call), which is why packed documents, whose
  mask keeps records apart, are refused with cp (train/run.py).
- **The rest of cp lives elsewhere**: the mesh's cp dimension (FSDP2 shards over dp_shard x cp, losses and token
  counts are summed over dp x cp: parallel/mesh.py), each rank's slice of tokens, labels and positions
  (data/loader.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform

ULYSSES = "bigtrain_ulysses"  # the name under transformers' AttentionInterface


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Equal slices of dim 0 exchanged over ``group`` (slice j to rank j), differentiable."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(x.contiguous(), None, None, group))


def sequence_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(batch, heads, local tokens, dim) -> (batch, heads / cp, all tokens, dim), tokens in rank order."""
    cp = dist.get_world_size(group)
    b, h, t, d = x.shape
    parts = x.reshape(b, cp, h // cp, t, d).transpose(0, 1)  # part j: the heads rank j attends over
    received = _all_to_all(parts, group)  # j: rank j's tokens for this rank's heads
    return received.permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * t, d)


def heads_to_sequence(y: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(batch, all tokens, heads / cp, dim) -> (batch, local tokens, heads, dim): attention's output layout back."""
    cp = dist.get_world_size(group)
    b, tokens, h, d = y.shape
    t = tokens // cp
    parts = y.reshape(b, cp, t, h, d).transpose(0, 1)  # part j: rank j's tokens
    received = _all_to_all(parts, group)  # j: head group j for this rank's tokens
    return received.permute(1, 2, 0, 3, 4).reshape(b, t, cp * h, d)


def ulysses_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: q, k, v as (batch, heads, local tokens, dim); returns the output as
    (batch, local tokens, heads, dim). ``attention_mask`` is None (transformers builds none for a custom attention)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    group = module.bigtrain_cp_group
    inner = ALL_ATTENTION_FUNCTIONS[module.bigtrain_cp_inner]
    q, k, v = (sequence_to_heads(x, group) for x in (query, key, value))
    out, _ = inner(module, q, k, v, None, **kwargs)
    return heads_to_sequence(out, group), None


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The modules that call transformers' attention interface (they carry ``is_causal`` and ``layer_idx``)."""
    return [m for m in model.modules() if hasattr(m, "is_causal") and hasattr(m, "layer_idx")]


def _use_ulysses(built: BuiltModel, ctx: BuildContext) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ULYSSES, ulysses_attention)
    group = ctx.mesh.cp_group
    for part in built.parts:
        for module in attention_modules(part):
            module.bigtrain_cp_group = group
            module.bigtrain_cp_inner = ctx.options.attn_implementation
        part.config._attn_implementation = ULYSSES


TRANSFORM = Transform(
    name="context_parallel",
    wanted=lambda options: options.plan.cp > 1,
    apply=_use_ulysses,
    planner_terms=("memory_terms.micro_batch_activations", "cost.estimate_time"),
)
