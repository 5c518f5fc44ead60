"""FSDP2 (``fully_shard``): each decoder block is one sharding unit, the root holds embeddings, final norm and head.

``zero_stage`` 3 frees each block's gathered parameters after its forward (ZeRO-3: least memory, one more all-gather
in backward); 2 keeps them until backward is done (ZeRO-2-like: gradients and optimizer states sharded, no
re-gather). Mixed precision keeps fp32 sharded master weights, computes in bf16/fp16 and reduces gradients in fp32.

Gradient accumulation (``grad_reduce``):
- ``every_micro_step``: each micro-step's backward reduce-scatters every block's gradient and adds it to the sharded
  gradient, so between micro-steps a rank holds 4 bytes per parameter / dp_shard (torchtitan's behaviour; the right
  default when memory is what limits). Under HSDP the cross-replica all-reduce is still deferred to the last
  micro-step (``set_requires_all_reduce``): FSDP2 sums the reduce-scattered parts until then.
- ``once_per_step``: no reduction before the last micro-step (``set_requires_gradient_sync(False)``); each block
  keeps its *unsharded* gradient in the reduce dtype, 4 bytes per parameter of the whole model, in exchange for
  1/accum of the reduce-scatter traffic.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import Shard

from bigtrain.config.plan import Plan
from bigtrain.parallel.mesh import WorldMesh
from bigtrain.parallel.precision import COMPUTE_DTYPES
from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform

log = logging.getLogger("bigtrain")


def apply_fsdp(
    model: nn.Module,
    blocks: list[nn.Module],
    plan: Plan,
    mesh: WorldMesh,
    mixed_precision: str,
    experts: list[nn.Module] | None = None,
    full_precision: list[nn.Module] | None = None,
    inputs_as_given: list[nn.Module] | None = None,
) -> None:
    """``inputs_as_given``: blocks whose floating-point inputs are not cast to the compute dtype (a vision tower's:
    Qwen-VL computes its rotary embeddings in fp32 on purpose and hands them to every block)."""
    mp = MixedPrecisionPolicy(param_dtype=COMPUTE_DTYPES[mixed_precision], reduce_dtype=torch.float32)
    as_given = MixedPrecisionPolicy(mp.param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    uncast = {id(m) for m in inputs_as_given or []}
    offload: OffloadPolicy = OffloadPolicy()
    if plan.offload_params:
        if mesh.mesh.device_type == "cuda":
            offload = CPUOffloadPolicy()
        else:
            log.warning("parallel.offload_params has no effect on CPU: parameters already live in host memory")
    reshard = plan.zero_stage == 3
    kwargs = {"mesh": mesh.fsdp_mesh, "mp_policy": mp, "offload_policy": offload}
    kwargs["shard_placement_fn"] = shard_placement(mesh.fsdp_mesh.size())
    for module in experts or []:
        _shard_experts(module, mesh, {**kwargs, "mesh": mesh.expert_fsdp_mesh, "shard_placement_fn": None}, reshard)
    if mp.param_dtype not in (None, torch.float32):  # e.g. BatchNorm: gathered and computed in fp32
        # its input is not cast: the module upcasts it itself and answers in the compute dtype the model runs in
        fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)
        for module in full_precision or []:
            fully_shard(module, **{**kwargs, "mp_policy": fp32}, reshard_after_forward=reshard)
    for block in blocks:
        policy = as_given if id(block) in uncast else mp
        fully_shard(block, **{**kwargs, "mp_policy": policy}, reshard_after_forward=reshard)
    # The root's parameters (embeddings, head) are needed again at once by backward: never reshard them after forward.
    fully_shard(model, **kwargs, reshard_after_forward=False)


def _shard_experts(module: nn.Module, mesh: WorldMesh, kwargs: dict, reshard: bool) -> None:
    """An experts module split over the ep ranks (``expert_parallel``), sharded on its own unit over the efsdp ranks
    that hold the same experts. Its gradients are averaged over every data-parallel rank, as the rest of the
    model's are: each rank's expert gradient already sums what the tokens of all ep ranks sent it (the
    all-to-all's backward), the efsdp reduction sums the copies, and the divisor is the dense units' (dp_shard,
    x dp_replicate under HSDP), not FSDP2's default of the efsdp group's size."""
    fully_shard(module, **kwargs, reshard_after_forward=reshard)
    module.set_gradient_divide_factor(float(mesh.fsdp_mesh.size()))
    if kwargs["mesh"].size() > 1:
        # a divisor other than the group's size is a PREMUL_SUM reduction, which gloo lacks (and NCCL zeroes in
        # bf16 before torch 2.13): reduce with a sum and divide after; on one rank FSDP2 divides by itself
        module.set_force_sum_reduction_for_comms(True)


def shard_placement(shards: int) -> Callable[[nn.Parameter], Shard | None]:
    """Where FSDP2 splits a parameter: dim 0 (its default), except for a parameter with fewer rows than ranks, such as
    a mixture's fused experts (8 of them in Mixtral: on 64 ranks, dim 0 would leave each holding a whole expert, 8
    times its share, and 56 ranks nothing), which is split along its widest dimension instead."""

    def place(param: nn.Parameter) -> Shard | None:
        if param.dim() < 2 or param.shape[0] >= shards:
            return None
        # FSDP2 needs a dimension other than 0 to divide evenly
        even = [d for d in range(1, param.dim()) if param.shape[d] % shards == 0]
        return Shard(max(even, key=lambda d: param.shape[d])) if even else None

    return place


def fsdp_grad_sync(
    model: FSDPModule, plan: Plan, mesh: WorldMesh
) -> Callable[[bool], contextlib.AbstractContextManager]:
    """The micro-step context: ``sync(last)`` reduces as ``plan.grad_reduce`` says (see the module docstring)."""
    hsdp = mesh.fsdp_mesh.ndim > 1  # sharded within replicas, all-reduced across them

    @contextlib.contextmanager
    def sync(last: bool) -> Iterator[None]:
        if plan.grad_reduce == "once_per_step":
            model.set_requires_gradient_sync(last)
        elif hsdp:
            model.set_requires_all_reduce(last)
        yield

    return sync


def _vision_tower(part: nn.Module, hf_config: Any) -> nn.Module | None:
    """A model's vision tower beside its language model (its blocks keep their inputs' dtypes), else None."""
    from bigtrain.config.model_parts import has_parts, part_module

    return part_module(part, "vision_tower") if has_parts(hf_config) else None


def _shard(built: BuiltModel, ctx: BuildContext) -> None:
    """Every part sharded on meta (nothing is allocated); FSDP2 casts parameters itself, so nothing is autocast."""
    for index, part in enumerate(built.parts):
        experts = [m for m in built.experts if any(m is sub for sub in part.modules())]
        kept = [m for m in built.full_precision if any(m is sub for sub in part.modules())]
        tower = _vision_tower(part, ctx.options.hf_config)
        blocks = built.blocks(index)
        as_given = [b for b in blocks if any(b is sub for sub in tower.modules())] if tower is not None else []
        apply_fsdp(part, blocks, built.plan, ctx.mesh, ctx.options.mixed_precision, experts, kept, as_given)
    built.autocast_dtype = None
    if built.plan.pp == 1:  # pipeline schedules drive the stages' gradient sync themselves
        built.grad_sync = fsdp_grad_sync(built.parts[0], built.plan, ctx.mesh)


TRANSFORM = Transform(
    name="fsdp",
    wanted=lambda options: options.plan.backend == "fsdp2",
    apply=_shard,
    planner_terms=(
        "data_parallel_memory.estimate_data_parallel_memory",
        "data_parallel_memory.fsdp2_block_backward",
        "data_parallel_memory.fsdp2_embedding_backward",
        "cost.estimate_time",
    ),
)
