"""The global gradient norm (what one process holding the whole model would compute), and clipping by it."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def clip_global_grad_norm(
    params: list[nn.Parameter], max_norm: float, stages_group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """The L2 norm of all gradients of the whole model before clipping, with gradients clipped to ``max_norm``.

    Gradients are DTensors sharded over the data-parallel mesh (FSDP2) or over data-parallel x tensor-parallel (TP
    weights); torch's norm reduces over one mesh at a time (``clip_grad_norm_`` refuses mixed meshes), so each
    mesh's gradients get their own total norm, reduced to a plain number on every rank, and those combine into one.
    With pipeline parallelism each rank holds only its stages' parameters: ``stages_group`` (the pp group) sums
    the squared norms of all stages. ``max_norm <= 0`` only measures. Returns a tensor (no host sync), for the
    simulator too.
    """
    groups: dict[object, list[nn.Parameter]] = {}
    for p in params:
        if p.grad is not None:
            groups.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
    norms = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], foreach=True)
        if isinstance(norm, DTensor):
            # reduced where the mesh's collectives run: offloaded gradients (FSDP2 CPU offload) live on the host
            norm = norm.to(norm.device_mesh.device_type).full_tensor()
        norms.append(norm)
    total = torch.linalg.vector_norm(torch.stack(norms)) if len(norms) > 1 else norms[0]
    if stages_group is not None:
        squared = total.double() ** 2
        dist.all_reduce(squared, group=stages_group)
        total = squared.sqrt().to(total.dtype)
    if max_norm > 0:
        for group in groups.values():  # torch's foreach kernels take one mesh at a time
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
    return total
