"""The optimizer (AdamW) and the learning-rate schedule of a recipe."""

from __future__ import annotations

import math

import torch
from torch import nn

from bigtrain.config.schema import TrainConfig


def build_optimizer(params: list[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    # On CUDA the fused kernel updates every parameter in one launch per dtype group; elsewhere torch's default
    # (for-each) implementation.
    fused = True if params and params[0].device.type == "cuda" else None
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
        fused=fused,
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
