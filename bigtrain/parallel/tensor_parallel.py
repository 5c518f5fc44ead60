"""Tensor parallelism (Megatron-style) inside each decoder block, with torch's DTensor ``parallelize_module``.

The layout is data from the model itself: transformers ships ``base_model_tp_plan`` in the configs of Llama,
Mistral, Qwen2 and their relatives (q/k/v and gate/up projections column-wise, o and down projections row-wise).
Each attention and MLP then runs on its 1/tp slice of heads and hidden units and ends in one all-reduce (the
row-wise output). HF's attention reshapes with -1, so the local head count needs no config change; the query and
key/value heads must both divide by tp. Embeddings, norms and the LM head stay replicated over tp: every tp rank
computes them on identical inputs, so their gradients are identical too and need no tp reduction.

Applied on the meta model before activation checkpointing and FSDP2 (``parallel/apply.py``), so FSDP2 shards the
already-sliced weights over the data-parallel dimensions (2-D DTensors) and no rank ever holds a whole matrix.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from bigtrain.config.hf import TP_STYLES, tp_layout

_STYLE_CLASSES: dict[str, type[ParallelStyle]] = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
assert set(_STYLE_CLASSES) == set(TP_STYLES)


def tp_module_plan(base_model: nn.Module, layout: dict[str, str]) -> dict[str, ParallelStyle]:
    """The layout's wildcard patterns (``layers.*.self_attn.q_proj``) expanded to this model's module names."""
    plan = {}
    for name, _ in base_model.named_modules():
        for pattern, style in layout.items():
            if fnmatchcase(name, pattern):
                plan[name] = _STYLE_CLASSES[style]()
    return plan


def apply_tensor_parallel(model: nn.Module, hf_config: Any, tp_mesh: DeviceMesh, loss_parallel: bool = False) -> None:
    """Slice the model's projections over ``tp_mesh`` in place (on meta: nothing is allocated).

    ``loss_parallel``: the LM head too, column-wise over the vocabulary, its output kept a DTensor sharded on the
    last dimension: the engine's cross-entropy then runs on the shards under torch's ``loss_parallel`` (one
    all-reduce of per-token maxima and sums instead of gathering b·L·V logits), so each rank holds 1/tp of them.
    """
    base = model.base_model  # the decoder under the LM head: the layout's names are relative to it
    plan = tp_module_plan(base, tp_layout(hf_config))
    if not plan:
        raise RuntimeError(f"the tensor-parallel layout of {type(model).__name__} matched none of its modules")
    parallelize_module(base, tp_mesh, plan)
    if loss_parallel:
        head = model.get_output_embeddings()
        name = next(n for n, m in model.named_modules() if m is head)
        parallelize_module(model, tp_mesh, {name: ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
