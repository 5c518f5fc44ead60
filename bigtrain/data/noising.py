"""Rectified-flow (flow-matching) training of a diffusion transformer (FLUX, SD3), as diffusers' training scripts
compute it (``examples/dreambooth/train_dreambooth_flux.py``, ``training_utils.py``), with one change that makes a
run equal whatever its plan: each example's timestep and noise come from a generator of its own, keyed by the run's
seed and the example's position in the run's global order, never from a device's global random state (whose draws
would depend on which rank and micro-batch the example landed in).

For an example of clean latents x (the VAE's, shifted and scaled):

- u in [0, 1) drawn by the timestep density (``none``: uniform; ``logit_normal``: sigmoid of N(mean, std), SD3's
  default; ``mode``: SD3's mode sampling with its scale; ``sigma_sqrt`` and ``cosmap`` draw uniformly and weight);
- the scheduler's index i = floor(u N) (N = 1000 training timesteps) and sigma = shift((N - i) / N), where
  shift(s) = k s / (1 + (k - 1) s) for a scheduler without dynamic shifting (SD3: k = 3) and the identity for one
  with it (FLUX's schedulers shift at inference only); the timestep the model reads is sigma N;
- the noisy input (1 - sigma) x + sigma e, the target e - x (e: standard normal noise);
- the loss: the mean over the example's elements of w(sigma) (prediction - target)^2, w = 1 but for ``sigma_sqrt``
  (sigma^-2) and ``cosmap`` (2 / (pi (1 - 2 sigma + 2 sigma^2))), averaged over the global batch's examples.

FLUX's transformer reads latents packed into 2 x 2 patches (``pack`` / ``unpack``) with a position id per patch
(``image_ids``); SD3's reads them as they are.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import torch

DENSITIES = ("none", "logit_normal", "mode", "sigma_sqrt", "cosmap")
TRAIN_TIMESTEPS = 1000


@dataclass(frozen=True)
class FlowMatching:
    """The recipe's flow-matching settings (``train.weighting_scheme`` and its companions; the scheduler's shift)."""

    weighting_scheme: str = "none"
    logit_mean: float = 0.0
    logit_std: float = 1.0
    mode_scale: float = 1.29
    shift: float = 1.0  # the scheduler's shift where it shifts in training (SD3: 3.0); 1.0: none (FLUX)
    timesteps: int = TRAIN_TIMESTEPS


def example_generator(seed: int, position: int) -> torch.Generator:
    """The generator of the example at ``position`` of the run's global order (step x global batch + its place in
    the step's batch: what the loader hands ``micro_batch`` as ``seen``): the same whatever rank and micro-batch
    reads it, another at each visit."""
    key = zlib.crc32(f"{seed}:{position}".encode())
    return torch.Generator().manual_seed(key)


def draw_u(fm: FlowMatching, generator: torch.Generator) -> float:
    """One draw of the timestep density (diffusers' ``compute_density_for_timestep_sampling`` for one example)."""
    if fm.weighting_scheme == "logit_normal":
        u = torch.sigmoid(torch.normal(fm.logit_mean, fm.logit_std, size=(1,), generator=generator))
    elif fm.weighting_scheme == "mode":
        u = torch.rand(1, generator=generator)
        u = 1 - u - fm.mode_scale * (torch.cos(math.pi * u / 2) ** 2 - 1 + u)
    else:
        u = torch.rand(1, generator=generator)
    return float(u)


def sigma_of(fm: FlowMatching, u: float) -> float:
    """The scheduler's sigma at index floor(u N) (its sigmas run from 1 down to 1/N, shifted where it shifts)."""
    n = fm.timesteps
    index = min(int(u * n), n - 1)
    s = (n - index) / n
    return fm.shift * s / (1 + (fm.shift - 1) * s)


def noised(latents: torch.Tensor, noise: torch.Tensor, sigmas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the noisy input, the target) for latents [B, ...] and sigmas [B]."""
    s = sigmas.view(-1, *([1] * (latents.dim() - 1))).to(latents.dtype)
    return (1.0 - s) * latents + s * noise, noise - latents


def pack(latents: torch.Tensor) -> torch.Tensor:
    """FLUX's packing: [B, C, H, W] latents as [B, (H/2)(W/2), 4C] patches of 2 x 2."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(packed: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``pack``'s inverse for latents of ``height`` x ``width``."""
    b, _, c4 = packed.shape
    x = packed.view(b, height // 2, width // 2, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c4 // 4, height, width)


def image_ids(height: int, width: int) -> torch.Tensor:
    """FLUX's position ids of the packed patches of [height x width] latents: [(H/2)(W/2), 3] (0, row, column)."""
    ids = torch.zeros(height // 2, width // 2, 3)
    ids[..., 1] += torch.arange(height // 2)[:, None]
    ids[..., 2] += torch.arange(width // 2)[None, :]
    return ids.reshape(-1, 3)


def flow_of(train: Any, shift: float = 1.0, scheme: str = "none") -> FlowMatching:
    """The recipe's flow-matching settings (its ``train`` section), with the scheduler's training ``shift``;
    ``scheme``: the weighting scheme where the recipe sets none (the family's script's default)."""
    chosen = train.weighting_scheme or scheme
    return FlowMatching(chosen, train.logit_mean, train.logit_std, train.mode_scale, shift)
