"""Optimizer, learning-rate schedule, global-norm clipping and fp16 dynamic loss scaling."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from bigtrain.config.schema import TrainConfig


def build_optimizer(params: list[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, weight_decay=cfg.weight_decay
    )


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of ``cfg.lr`` for optimizer step ``step`` (0-based).

    Linear warmup over ``warmup_steps`` (step s uses (s+1)/warmup_steps), then constant or a half cosine from 1 down
    to ``min_lr_ratio`` at the last step.
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return 1.0
    decay_steps = max(1, cfg.steps - cfg.warmup_steps - 1)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))


def clip_global_grad_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """The L2 norm of all gradients of the whole model (what one process would compute), clipped to ``max_norm``.

    With FSDP2 each gradient is a DTensor shard; torch's norm then reduces over the mesh, so every rank gets the same
    true global number. ``max_norm <= 0`` only measures. Returns a tensor (no host sync), for the simulator too.
    """
    if max_norm > 0:
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    else:
        total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)
    return total.full_tensor() if isinstance(total, DTensor) else total


class DynamicLossScaler:
    """fp16 loss scaling whose skip decision is global.

    torch's GradScaler looks for inf/NaN in each rank's own gradients; with sharded gradients one rank can overflow
    while another does not, and the ranks' optimizer steps would diverge. Here the decision comes from the global
    gradient norm, which every rank computes identically, so all ranks skip or step together.
    """

    def __init__(self, initial_scale: float, growth_interval: int = 2000) -> None:
        self.scale = initial_scale
        self.growth_interval = growth_interval
        self._clean_steps = 0

    def update(self, finite: bool) -> None:
        if not finite:
            self.scale /= 2.0
            self._clean_steps = 0
            return
        self._clean_steps += 1
        if self._clean_steps % self.growth_interval == 0:
            self.scale *= 2.0


@torch.no_grad()
def unscale_grads(params: list[nn.Parameter], scale: float) -> None:
    grads = [p.grad for p in params if p.grad is not None]
    if grads and scale != 1.0:
        torch._foreach_mul_(grads, 1.0 / scale)
