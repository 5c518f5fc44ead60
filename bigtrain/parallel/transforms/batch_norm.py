"""BatchNorm across data-parallel ranks (the batch_norm record's step, ``parallel.sync_batchnorm``).

BatchNorm is the one layer whose output depends on how a batch is split: in training mode it normalises by the
statistics of the images in its forward. Two ways, both with running statistics that are the same on every rank
after each optimizer step (so a checkpoint and the exported model hold one set of them):
- ``sync_batchnorm: false`` (default): each rank normalises by its own micro-batch's statistics and updates its
  running statistics from them; after each optimizer step the running mean and variance are averaged over the
  data-parallel ranks (one all-reduce of a few KB). DDP's own alternative, rank 0's buffers broadcast at every
  forward, would drop what the other ranks accumulated, so DDP runs with ``forward_sync_buffers=False``.
- ``sync_batchnorm: true``: a micro-step's statistics are those of every data-parallel rank's images of that
  micro-step together (the mean, then the squared deviations from it, all-reduced with torch's differentiable
  all-reduce, so backward gets the gradient through them), as one BatchNorm over the concatenated micro-batches
  computes them; the running
  statistics are then the same on every rank by construction. torch's ``nn.SyncBatchNorm`` does the same on CUDA
  only (it refuses CPU tensors); the layer here runs on any device, over the plan's data-parallel group.
BatchNorm keeps fp32 under bf16: its forward upcasts the input (and its output goes back to the input's dtype), and
under FSDP2 each BatchNorm is a unit of its own whose parameters are gathered in fp32 (``BuiltModel.full_precision``),
as FSDP1 kept BatchNorm out of its mixed precision; DDP keeps fp32 weights anyway.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from bigtrain.config.capabilities.batch_norm import SYNC_BATCHNORM
from bigtrain.parallel.transforms.base import BuildContext, BuildOptions, BuiltModel, Transform


def batch_norms(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def wanted(options: BuildOptions) -> bool:
    """Every plan of a model with BatchNorm (``apply`` changes nothing in one without): the layer computes in fp32,
    and where data-parallel ranks see different images it learns whose statistics it normalises by."""
    return True


class DataParallelBatchNorm(nn.modules.batchnorm._BatchNorm):
    """A BatchNorm (1d, 2d or 3d: its class is swapped in place, parameters and buffers kept) that normalises
    training batches by the statistics of every rank of ``group`` together, or of its own rank when ``group`` is
    None (then in fp32 through torch's own batch_norm)."""

    group: dist.ProcessGroup | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        if not self.training or self.group is None:
            return self._own(x, weight, bias)
        return self._synchronised(x, weight, bias)

    def _own(self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
        """torch's BatchNorm forward, in fp32."""
        factor = self.momentum or 0.0
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        mean, var = (self.running_mean, self.running_var) if keep else (None, None)
        if mean is None or mean.dtype == torch.float32:
            return F.batch_norm(x.float(), mean, var, weight, bias, use_batch, factor, self.eps).to(x.dtype)
        # buffers an engine cast to bf16/fp16 with the model (DeepSpeed): updated in fp32, stored back
        mean32, var32 = mean.float(), var.float()
        out = F.batch_norm(x.float(), mean32, var32, weight, bias, use_batch, factor, self.eps).to(x.dtype)
        mean.copy_(mean32)
        var.copy_(var32)
        return out

    def _synchronised(self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
        xf = x.float()
        dims = [0, *range(2, x.dim())]
        channels = x.shape[1]
        shape = [1, channels] + [1] * (x.dim() - 2)
        # two passes, as torch's own batch norm: the mean over every rank's images, then the sum of squared
        # deviations from it (E[x²] - E[x]² in fp32 would lose the variance of inputs far from zero)
        count = torch.tensor([x.numel() // channels], dtype=torch.float32, device=x.device)
        sums = _summed(torch.cat([xf.sum(dims), count]), self.group)  # backward: all-reduced too
        total = sums[-1]
        mean = sums[:channels] / total
        d = xf - mean.view(shape)
        var = _summed((d * d).sum(dims), self.group) / total  # biased, what is normalised by
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked + 1)
                unbiased = var.detach() * total / (total - 1).clamp(min=1)
                self.running_mean.copy_(self.running_mean.float().lerp(mean.detach(), momentum))
                self.running_var.copy_(self.running_var.float().lerp(unbiased, momentum))
                self.num_batches_tracked.add_(1)
        y = d * torch.rsqrt(var.view(shape) + self.eps)
        if weight is not None:
            y = y * weight.view(shape) + bias.view(shape)
        return y.to(x.dtype)


def apply(built: BuiltModel, ctx: BuildContext) -> None:
    """Every BatchNorm of the parts becomes a ``DataParallelBatchNorm`` over the data-parallel ranks (synchronised)
    or over none (its own rank's statistics, averaged after each step); on meta, before anything wraps it."""
    plan = built.plan
    ranks = plan.dp_replicate * plan.dp_shard
    group = ctx.mesh.batch_group if SYNC_BATCHNORM.of(plan) and ranks > 1 else None
    for part in built.parts:
        for module in batch_norms(part):
            swap_in(module, group)
            built.full_precision.append(module)


def swap_in(module: nn.modules.batchnorm._BatchNorm, group: dist.ProcessGroup | None) -> None:
    """``module`` becomes a ``DataParallelBatchNorm`` over ``group`` (None: its own rank's statistics)."""
    module.__class__ = _swapped(type(module))
    module.group = group  # type: ignore[attr-defined]


@functools.cache
def _swapped(cls: type) -> type:
    """``cls`` (a torch BatchNorm class) with ``DataParallelBatchNorm``'s forward: isinstance checks (HF's weight
    init, torch's input-dimension check) still see the original class. One class per original (cached), so
    modules of the same class stay of the same class."""
    if issubclass(cls, DataParallelBatchNorm):
        return cls
    return type(cls.__name__, (DataParallelBatchNorm, cls), {})


def average_running_statistics(built: BuiltModel) -> None:
    """After an optimizer step: each rank's running mean and variance replaced by their mean over the data-parallel
    ranks (one all-reduce of all of them). Under ``sync_batchnorm`` they are equal already."""
    if SYNC_BATCHNORM.of(built.plan):
        return
    stats = [t for part in built.parts for m in batch_norms(part) for t in _running(m)]
    if not stats:
        return
    flat = torch.cat([t.reshape(-1).float() for t in stats])
    group = built.mesh.batch_group
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for t in stats:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def _running(module: Any) -> list[torch.Tensor]:
    return [t for t in (module.running_mean, module.running_var) if t is not None]


TRANSFORM = Transform(
    name="batch_norm",
    wanted=wanted,
    apply=apply,
    after_step=average_running_statistics,
    planner_terms=("classifier_stats.measure_classifier",),  # its fp32 copy of each input, measured
)


def keep_statistics_fp32(model: nn.Module) -> None:
    """BatchNorm's running statistics back in fp32 after an engine cast the whole module to bf16/fp16 (DeepSpeed):
    a momentum-0.1 update smaller than half a bf16 step would be lost, and the statistics would stop moving."""
    for module in batch_norms(model):
        for name in ("running_mean", "running_var"):
            buffer = getattr(module, name)
            if buffer is not None and buffer.dtype != torch.float32:
                setattr(module, name, buffer.float())


class _Summed(torch.autograd.Function):
    """The sum over ``group``'s ranks of a tensor, whose gradient is the sum of the ranks' gradients (every rank's
    loss depends on every rank's statistics). torch's own ``torch.distributed.nn.functional.all_reduce`` does this
    but warns on every call that it is deprecated, and its functional replacement has no backward."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = grad.contiguous().clone()
        dist.all_reduce(out, group=ctx.group)
        return out, None


def _summed(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    return _Summed.apply(tensor, group)
