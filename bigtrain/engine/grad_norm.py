"""The global gradient norm (what one process holding the whole model would compute), and clipping by it."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def clip_global_grad_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """The L2 norm of all gradients of the whole model before clipping, with gradients clipped to ``max_norm``.

    With FSDP2 each gradient is a DTensor shard; torch's norm then reduces over the mesh, so every rank gets the same
    true global number. ``max_norm <= 0`` only measures. Returns a tensor (no host sync), for the simulator too.
    """
    if max_norm > 0:
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    else:
        total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)
    return total.full_tensor() if isinstance(total, DTensor) else total
