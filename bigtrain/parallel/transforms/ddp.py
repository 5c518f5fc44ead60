"""DDP: every rank holds the whole model; gradients are all-reduced over the flattened data-parallel dimension.

``gradient_as_bucket_view``: gradients live inside DDP's communication buckets instead of beside them (saves 4Ψ).
Gradients are reduced once per optimizer step: inner micro-steps run under ``no_sync`` and only accumulate, since
reducing each of them would move the same bytes ``accum`` times for the same final sum. DDP wraps real values (it
broadcasts rank 0's), so it is the last transform, after the values are loaded.

In the simulator (values left empty, tensors shape-only) DDP's reducer cannot run: the model stays unwrapped and
what the reducer adds to memory under ``gradient_as_bucket_view`` is emulated instead: one flat fp32 bucket storage,
allocated up front and kept, into which every gradient is moved once accumulated.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bigtrain.parallel.mesh import WorldMesh
from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform


def _no_forward_buffer_sync() -> dict[str, bool]:
    """DDP's switch for its buffer broadcast at every forward: ``forward_sync_buffers`` where torch has it (2.13, which
    deprecates the older name), ``broadcast_buffers`` before."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def apply_ddp(model: nn.Module, mesh: WorldMesh, device: torch.device) -> DistributedDataParallel:
    """Wrap a materialised model (DDP broadcasts rank 0's values, so it must come after materialisation)."""
    device_ids = [device.index] if device.type == "cuda" else None
    # A frozen base quantised by QLoRA is the same on every rank (made from the same values) and not a plain tensor
    # DDP could broadcast: DDP leaves it alone.
    quantized = [
        name for name, p in model.named_parameters() if not p.requires_grad and type(p.data) is not torch.Tensor
    ]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, quantized)
    return DistributedDataParallel(
        model,
        device_ids=device_ids,
        process_group=mesh.batch_group,
        gradient_as_bucket_view=True,
        # buffers are not rank 0's at every forward (DDP's default would overwrite what each rank's BatchNorm
        # accumulated over a step's micro-batches): BatchNorm's running statistics are averaged over the ranks
        # after each step instead (batch_norm.py); a causal LM's buffers are constants
        **_no_forward_buffer_sync(),
    )


def ddp_grad_sync(model: DistributedDataParallel) -> Callable[[bool], contextlib.AbstractContextManager]:
    def sync(last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if last else model.no_sync()

    return sync


def emulate_buckets(model: nn.Module) -> torch.Tensor:
    """DDP with gradient_as_bucket_view on shape-only tensors: gradients become views of one flat fp32 storage."""
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.empty(sum(p.numel() for p in params), dtype=torch.float32, device=params[0].device)
    offset = 0
    for p in params:
        view = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()

        def into_bucket(param: torch.Tensor, view: torch.Tensor = view) -> None:
            if param.grad is not view:
                view.copy_(param.grad)
                param.grad = view

        p.register_post_accumulate_grad_hook(into_bucket)
    return flat


def _wrap(built: BuiltModel, ctx: BuildContext) -> None:
    model = built.parts[0]
    if ctx.options.values == "empty":  # the simulator: no values to broadcast, no reducer on fake tensors
        with ctx.options.fake_mode or contextlib.nullcontext():
            built.extra_tensors.append(emulate_buckets(model))
        return
    ddp = apply_ddp(model, ctx.mesh, ctx.options.device)
    built.module = ddp
    built.grad_sync = ddp_grad_sync(ddp)


TRANSFORM = Transform(
    name="ddp",
    # a frozen copy has no gradient to reduce (DDP refuses it): each rank holds it whole
    wanted=lambda options: options.plan.backend == "ddp" and not options.frozen,
    apply=_wrap,
    planner_terms=("data_parallel_memory.estimate_data_parallel_memory", "cost.estimate_time"),
)
