"""Apply a plan to a meta model, in the one fixed order, then materialise it.

Order (the only place it is written): pipeline split into this rank's stages (pp > 1) -> tensor parallel over the
mesh's tp dimension -> activation checkpointing -> FSDP2 sharding -> materialise on the device -> DDP wrapper.
Each pipeline stage is a HF model of its own (``parallel/pipeline.py``) and goes through the same steps.
Tensor parallelism slices the projections first, so FSDP2 shards slices (2-D DTensors over dp x tp). Checkpointing
wraps blocks before FSDP so that FSDP's all-gather hooks sit outside the recomputed region (torchtitan's order);
sharding happens on ``meta`` so that no rank ever allocates the unsharded model (DDP excepted); DDP comes last
because it broadcasts real values.

The result, :class:`ParallelModel` (or :class:`PipelineParts` for pp > 1), is what an engine drives: a module to
call, the dtype to autocast to (if the backend does not cast parameters itself), and the per-micro-step
gradient-sync context of the backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bigtrain.config.pipeline import stages_of_rank
from bigtrain.config.plan import Plan
from bigtrain.models.build import build_meta_model, decoder_blocks
from bigtrain.models.materialize import materialize
from bigtrain.parallel.activation_checkpoint import apply_activation_checkpoint
from bigtrain.parallel.ddp import apply_ddp, ddp_grad_sync
from bigtrain.parallel.fsdp import apply_fsdp, fsdp_grad_sync
from bigtrain.parallel.mesh import WorldMesh
from bigtrain.parallel.pipeline import build_stages
from bigtrain.parallel.precision import COMPUTE_DTYPES
from bigtrain.parallel.tensor_parallel import apply_tensor_parallel


def _no_sync_needed(last: bool) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


@dataclass(frozen=True)
class ParallelModel:
    module: nn.Module  # what forward is called on (the FSDP2 root, the DDP wrapper, or the plain model)
    model: nn.Module  # the HF model itself with the plan applied in place: its state has the HF parameter names
    plan: Plan
    mesh: WorldMesh
    # DDP keeps fp32 weights and computes under autocast; FSDP2 casts parameters itself (MixedPrecisionPolicy)
    autocast_dtype: torch.dtype | None
    # grad_sync(last) wraps one micro-step's forward and backward: whether gradients are reduced on this micro-step
    grad_sync: Callable[[bool], contextlib.AbstractContextManager]


@dataclass(frozen=True)
class PipelineParts:
    stages: list[nn.Module]  # the HF stage models this rank runs, in stage order; each one is its own FSDP2 root
    stage_ids: list[int]  # their indices in the pipeline
    plan: Plan
    mesh: WorldMesh
    compute_dtype: torch.dtype  # what the stages compute in, and so what flows between them


def _shard_in_order(
    model: nn.Module, hf_config: Any, plan: Plan, mesh: WorldMesh, mixed_precision: str, compile_blocks: bool
) -> None:
    if plan.tp > 1:
        apply_tensor_parallel(model, hf_config, mesh.mesh["tp"], plan.loss_parallel, plan.sequence_parallel)
    blocks = apply_activation_checkpoint(decoder_blocks(model), plan.activation_checkpointing)
    if compile_blocks:
        for block in blocks:
            block.compile()  # in place: names (and checkpoints) keep no "_orig_mod" prefix
    if plan.backend == "fsdp2":
        apply_fsdp(model, blocks, plan, mesh, mixed_precision)


def parallelize(
    model: nn.Module, hf_config: Any, plan: Plan, mesh: WorldMesh, mixed_precision: str, compile_blocks: bool = False
) -> ParallelModel:
    """Every step of the plan that happens before materialisation, applied in place to an unmaterialised model."""
    _shard_in_order(model, hf_config, plan, mesh, mixed_precision, compile_blocks)
    if plan.backend == "fsdp2":
        return ParallelModel(model, model, plan, mesh, None, fsdp_grad_sync(model, plan, mesh))
    return ParallelModel(model, model, plan, mesh, COMPUTE_DTYPES[mixed_precision], _no_sync_needed)


def parallelize_pipeline(
    model: nn.Module, hf_config: Any, plan: Plan, mesh: WorldMesh, mixed_precision: str, compile_blocks: bool = False
) -> PipelineParts:
    """This rank's pipeline stages cut from ``model`` (left untouched), each sharded like a whole model."""
    stage_ids = stages_of_rank(mesh.coordinate("pp"), plan)
    stages = build_stages(model, hf_config, plan, stage_ids)
    for stage in stages:
        _shard_in_order(stage, hf_config, plan, mesh, mixed_precision, compile_blocks)
    return PipelineParts(stages, stage_ids, plan, mesh, COMPUTE_DTYPES[mixed_precision])


def replicate(parallel: ParallelModel, device: torch.device) -> ParallelModel:
    """The steps after materialisation: the DDP wrapper for ddp plans, nothing otherwise."""
    if parallel.plan.backend != "ddp":
        return parallel
    ddp = apply_ddp(parallel.model, parallel.mesh, device)
    return dataclasses.replace(parallel, module=ddp, grad_sync=ddp_grad_sync(ddp))


def build_parallel_model(
    hf_config: Any,
    attn_implementation: str,
    plan: Plan,
    mesh: WorldMesh,
    device: torch.device,
    mixed_precision: str,
    checkpoint: str | None,
    seed: int,
    compile_blocks: bool = False,
) -> ParallelModel | PipelineParts:
    """Meta model -> plan applied (pp > 1: cut into this rank's stages first) -> values from ``checkpoint`` (a HF
    folder) or HF's init under ``seed``: the whole model's initialisation is walked whatever the plan, each rank
    keeping its part, so every plan starts from the same values."""
    meta = build_meta_model(hf_config, attn_implementation)
    # FSDP2's CPU offload wants the sharded parameters in host memory from the start
    param_device = torch.device("cpu") if plan.offload_params and device.type == "cuda" else None
    if plan.pp > 1:
        # stages are copies: meta stays whole
        parts = parallelize_pipeline(meta, hf_config, plan, mesh, mixed_precision, compile_blocks)
        materialize(parts.stages, meta, device, checkpoint, seed, param_device)
        for stage in parts.stages:
            stage.train()
        return parts
    # in place: the twin is a second one
    parallel = parallelize(meta, hf_config, plan, mesh, mixed_precision, compile_blocks)
    twin = build_meta_model(hf_config, attn_implementation)
    materialize([parallel.model], twin, device, checkpoint, seed, param_device)
    parallel.model.train()
    return replicate(parallel, device)
