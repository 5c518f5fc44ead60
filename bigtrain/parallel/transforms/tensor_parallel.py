"""Tensor parallelism (Megatron-style) inside each decoder block, with torch's DTensor ``parallelize_module``.

The layout is data from the model itself: transformers ships ``base_model_tp_plan`` in the configs of Llama,
Mistral, Qwen2 and their relatives (q/k/v and gate/up projections column-wise, o and down projections row-wise),
and of Phi-3 and OLMo-2 (column-wise outputs gathered, row-wise inputs split locally) and Qwen3 (per-head norms
replicated, their gradients summed); ``_torch_style`` maps each of transformers' style names onto torch's.
Each attention and MLP then runs on its 1/tp slice of heads and hidden units and ends in one all-reduce (the
row-wise output). HF's attention reshapes with -1, so the local head count needs no config change; the query and
key/value heads must both divide by tp. Embeddings, norms and the LM head stay replicated over tp: every tp rank
computes them on identical inputs, so their gradients are identical too and need no tp reduction.

Applied on the meta model before activation checkpointing and FSDP2 (the order: ``transforms/__init__.py``), so FSDP2
shards the already-sliced weights over the data-parallel dimensions (2-D DTensors) and no rank holds a whole matrix.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from bigtrain.config.hf import tp_layout
from bigtrain.config.model_parts import language_config, part_module
from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform


def _torch_style(style: str, sequence_parallel: bool) -> ParallelStyle:
    """transformers' style name as torch's DTensor style (``config.hf.TP_STYLES``)."""
    if style == "rowwise" and sequence_parallel:
        return RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    if style == "replicated_with_grad_allreduce":
        # a per-head norm (Qwen3's q_norm, k_norm) sees only this rank's heads (dimension -2 of its input): its weight
        # is replicated and each rank's gradient is a partial sum, which DTensor all-reduces into the weight's grad
        return SequenceParallel(sequence_dim=-2, use_local_output=True)
    styles = {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
        # an nn.Embedding under RowwiseParallel is vocabulary-parallel: each rank holds a slice of the rows (Shard(0)),
        # looks up the token ids it owns (the ids replicated on every rank) and the partial lookups are all-reduced
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
    }
    return styles[style]()


def tp_module_plan(
    base_model: nn.Module, layout: dict[str, str], sequence_parallel: bool = False
) -> dict[str, ParallelStyle]:
    """The layout's wildcard patterns (``layers.*.self_attn.q_proj``) expanded to this model's module names.

    ``sequence_parallel``: the row-wise projections end in a reduce-scatter onto sequence shards (kept as DTensors
    for the residual add) instead of an all-reduce."""
    plan: dict[str, ParallelStyle] = {}
    for name, _ in base_model.named_modules():
        for pattern, style in layout.items():
            if fnmatchcase(name, pattern):
                plan[name] = _torch_style(style, sequence_parallel)
    return plan


def _gather_sequence(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Before an attention or MLP under sequence parallelism: its input hidden states, sharded over the sequence,
    are all-gathered (a DTensor redistribute, so the backward reduce-scatters)."""

    def gather(x: Any) -> Any:
        return x.redistribute(placements=[Replicate()]) if isinstance(x, DTensor) else x

    if args:
        args = (gather(args[0]), *args[1:])
    if "hidden_states" in kwargs:
        kwargs = {**kwargs, "hidden_states": gather(kwargs["hidden_states"])}
    return args, kwargs


def _whole_sequence(module: nn.Module, args: tuple) -> tuple:
    """Before a replicated LM head: the final norm's sequence shards gathered into a plain tensor."""
    return tuple(a.full_tensor() if isinstance(a, DTensor) else a for a in args)


def _apply_sequence_parallel(model: nn.Module, base: nn.Module, tp_mesh: DeviceMesh, plan: dict[str, Any]) -> None:
    """Megatron-LM's sequence parallelism (Korthikanti et al. 2022) around the projections tp already splits: the
    embeddings' output is cut into sequence shards, every norm runs on its shard (torch's SequenceParallel), the
    attention and the MLP all-gather their input, and their row-wise projections reduce-scatter back (see
    ``tp_module_plan``). Between the projections each rank so holds 1/tp of the residual stream and the norms'
    activations, and communicates as much as the all-reduces it replaces."""
    sublayers = {name.rsplit(".", 1)[0] for name in plan}  # the attention and MLP modules around the projections
    styles: dict[str, ParallelStyle] = {}
    for block_name, block in base.named_modules():
        children = {f"{block_name}.{child}" for child, _ in block.named_children()} if block_name else set()
        if not children & sublayers:
            continue
        for child_name, child in block.named_children():
            full = f"{block_name}.{child_name}"
            if full in sublayers:
                child.register_forward_pre_hook(_gather_sequence, with_kwargs=True)
            elif any(True for _ in child.parameters()):  # the block's norms
                styles[full] = SequenceParallel()
    if not styles:
        raise RuntimeError(f"sequence parallelism found no norms in the blocks of {type(model).__name__}")
    norm = getattr(base, "norm", None)
    if norm is None:
        raise RuntimeError(f"sequence parallelism needs the final norm of {type(model).__name__} at .norm")
    styles["norm"] = SequenceParallel()
    # the embeddings stay whole on every tp rank; their output is cut into this rank's sequence shard
    styles["embed_tokens"] = PrepareModuleOutput(
        output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=False
    )
    parallelize_module(base, tp_mesh, styles)


def apply_tensor_parallel(
    model: nn.Module,
    hf_config: Any,
    tp_mesh: DeviceMesh,
    loss_parallel: bool = False,
    sequence_parallel: bool = False,
) -> None:
    """Slice the model's projections over ``tp_mesh`` in place (on meta: nothing is allocated).

    ``loss_parallel``: the LM head too, column-wise over the vocabulary, its output kept a DTensor sharded on the
    last dimension: the engine's cross-entropy then runs on the shards under torch's ``loss_parallel`` (one
    all-reduce of per-token maxima and sums instead of gathering b·L·V logits), so each rank holds 1/tp of them.
    ``sequence_parallel``: see ``_apply_sequence_parallel``.
    """
    base = model.base_model  # the decoder under the LM head: the layout's names are relative to it
    text_config = language_config(hf_config)
    if text_config is not hf_config:
        # a vision-language model: its language model's layout on its language model; the tower stays whole on every
        # tp rank (each rank of a tp group reads the same images)
        base = part_module(model, "language_model")
    plan = tp_module_plan(base, tp_layout(text_config), sequence_parallel)
    if not plan:
        raise RuntimeError(f"the tensor-parallel layout of {type(model).__name__} matched none of its modules")
    parallelize_module(base, tp_mesh, plan)
    if sequence_parallel:
        _apply_sequence_parallel(model, base, tp_mesh, plan)
    head = model.get_output_embeddings()
    if loss_parallel:
        name = next(n for n, m in model.named_modules() if m is head)
        input_layout = Shard(1) if sequence_parallel else Replicate()
        parallelize_module(
            model,
            tp_mesh,
            {name: ColwiseParallel(input_layouts=input_layout, output_layouts=Shard(-1), use_local_output=False)},
        )
    elif sequence_parallel:
        head.register_forward_pre_hook(_whole_sequence)


def _slice(built: BuiltModel, ctx: BuildContext) -> None:
    plan = built.plan
    for part in built.parts:
        apply_tensor_parallel(
            part, ctx.options.hf_config, ctx.mesh.mesh["tp"], plan.loss_parallel, plan.sequence_parallel
        )


TRANSFORM = Transform(
    name="tensor_parallel",
    wanted=lambda options: options.plan.tp > 1,
    apply=_slice,
    planner_terms=(
        "memory_terms.stage_params",
        "memory_terms.block_activation_bytes_per_token",
        "memory_terms.logits_bytes",
        "cost.estimate_time",
    ),
)
