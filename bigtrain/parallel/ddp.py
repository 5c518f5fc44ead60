"""DDP: every rank holds the whole model; gradients are all-reduced over the flattened data-parallel dimension.

``gradient_as_bucket_view``: gradients live inside DDP's communication buckets instead of beside them (saves 4Ψ).
Gradients are reduced once per optimizer step: inner micro-steps run under ``no_sync`` and only accumulate, since
reducing each of them would move the same bytes ``accum`` times for the same final sum.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bigtrain.parallel.mesh import WorldMesh


def apply_ddp(model: nn.Module, mesh: WorldMesh, device: torch.device) -> DistributedDataParallel:
    """Wrap a materialised model (DDP broadcasts rank 0's values, so it must come after materialisation)."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(
        model, device_ids=device_ids, process_group=mesh.dp_group, gradient_as_bucket_view=True
    )


def ddp_grad_sync(model: DistributedDataParallel) -> Callable[[bool], contextlib.AbstractContextManager]:
    def sync(last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if last else model.no_sync()

    return sync
