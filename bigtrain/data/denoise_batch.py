"""A text-to-image micro-batch before and after the frozen parts (``model.task: text-to-image``).

Each example draws, from the generator of its position in the run's global order (``example_generator``), a sample
of its latent distribution's standard normal, the noise and its timestep (``Noiser.draws``), in that order, so that
every plan noises each example alike. Its latents are then the VAE's mean plus its standard deviation times that
sample, shifted and scaled by the VAE's factors, and noised to the timestep (``Noiser.batch``).

Where the frozen parts' outputs come from is ``parallel.frozen_parts``: from the data cache, on the host
(``EncodedImages.micro_batch`` makes a ``DenoiseBatch`` at once), or from the VAE and text encoders on the device at
each step: the data then gives an ``ImageBatch`` (the images' pixels, the captions and the draws), which
``roles/frozen_parts.py`` encodes into the same ``DenoiseBatch`` before the transformer's forward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.data.noising import FlowMatching, draw_u, example_generator, image_ids, noised, pack, sigma_of


@dataclass(frozen=True)
class DenoiseBatch:
    """A micro-batch of a text-to-image model: the transformer's inputs (the noisy latents, packed for FLUX with
    their position ids; the prompt embeddings; the timestep), what it should predict (``target``: noise minus clean
    latents, in the inputs' layout), each example's ``sigmas`` (the loss's weighting reads them) and ``labels`` (0,
    or IGNORE_INDEX for an evaluation filler, which counts nothing)."""

    inputs: dict[str, torch.Tensor]
    target: torch.Tensor
    sigmas: torch.Tensor
    labels: torch.Tensor
    # train.precondition_outputs: the target is the clean latents, and the loss compares them with the prediction
    # made a denoised estimate (prediction x -sigma + the noisy input: ``losses/flow_matching.py``)
    preconditioned: bool = False

    def model_inputs(self) -> dict[str, Any]:
        return {**self.inputs, "return_dict": True}

    def _map(self, fn: Any) -> DenoiseBatch:
        return DenoiseBatch({k: fn(v) for k, v in self.inputs.items()}, fn(self.target), fn(self.sigmas),
                            fn(self.labels), self.preconditioned)  # fmt: skip

    def to(self, device: torch.device) -> DenoiseBatch:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> DenoiseBatch:
        return self._map(lambda t: t.pin_memory())

    def tensors(self) -> list[torch.Tensor]:
        return [*self.inputs.values(), self.target, self.sigmas, self.labels]

    def without_labels(self, rows: torch.Tensor) -> DenoiseBatch:
        return dataclasses.replace(self, labels=self.labels.masked_fill(rows, IGNORE_INDEX))


@dataclass(frozen=True)
class Noiser:
    """How a family's transformer reads noised latents: FLUX's packed into 2 x 2 patches with their position ids and
    the timestep as sigma; SD3's as they are (it patches them itself) and the timestep as sigma x N."""

    flow: FlowMatching
    scaling_factor: float
    shift_factor: float
    guidance: float | None  # a guidance-distilled transformer's input (FLUX.1-dev); None: it takes none
    family: str  # "flux" or "sd3"
    precondition: bool  # train.precondition_outputs (DenoiseBatch.preconditioned)

    def draws(self, seed: int, keys: Any, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the latent samples' standard normals, the noise, the sigmas) of examples keyed by ``keys``, latents of
        ``shape`` [C, h, w] (module docstring)."""
        samples, noise, sigmas = [], [], []
        for key in keys:
            g = example_generator(seed, int(key))
            samples.append(torch.randn(shape, generator=g))
            noise.append(torch.randn(shape, generator=g))
            sigmas.append(sigma_of(self.flow, draw_u(self.flow, g)))
        return torch.stack(samples), torch.stack(noise), torch.tensor(sigmas, dtype=torch.float32)

    def batch(
        self,
        moments: tuple[torch.Tensor, torch.Tensor],
        drawn: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        text: tuple[torch.Tensor, torch.Tensor],
        labels: torch.Tensor,
    ) -> DenoiseBatch:
        """The transformer's micro-batch from the VAE's (mean, log-variance) [B, C, h, w], the ``draws`` and the
        (prompt embeddings, pooled vectors), fp32, on one device."""
        (mean, logvar), (sample, noise, s), (embeds, pooled) = moments, drawn, text
        std = torch.exp(0.5 * logvar.clamp(-30.0, 20.0))
        x = (mean + std * sample - self.shift_factor) * self.scaling_factor
        noisy, target = noised(x, noise, s)
        if self.precondition:
            target = x
        if self.family == "sd3":  # the transformer patches the latents itself, and reads timesteps of sigma x N
            inputs = {"hidden_states": noisy, "encoder_hidden_states": embeds, "pooled_projections": pooled,
                      "timestep": s * self.flow.timesteps}  # fmt: skip
            return DenoiseBatch(inputs, target, s, labels, self.precondition)
        h, w = x.shape[-2:]
        inputs = {
            "hidden_states": pack(noisy),
            "encoder_hidden_states": embeds,
            "pooled_projections": pooled,
            "timestep": s,  # FLUX's transformer multiplies by the N training timesteps itself
            "img_ids": image_ids(h, w).to(x.device),
            "txt_ids": torch.zeros(embeds.shape[1], 3, device=x.device),
        }
        if self.guidance is not None:
            inputs["guidance"] = torch.full((len(labels),), self.guidance, device=x.device)
        return DenoiseBatch(inputs, pack(target), s, labels, self.precondition)


@dataclass(frozen=True)
class ImageBatch:
    """A micro-batch for frozen parts that run during training (``parallel.frozen_parts``: device or offloaded):
    each image's pixels at its bucket's size ([B, 3, H, W] in [-1, 1]), its caption, its draws, its label, and how
    the encoded latents are noised; the captions' text tokens (``text_len``)."""

    pixels: torch.Tensor
    captions: tuple[str, ...]
    drawn: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    labels: torch.Tensor
    noiser: Noiser
    text_len: int

    def _map(self, fn: Any) -> ImageBatch:
        drawn = tuple(fn(t) for t in self.drawn)
        return dataclasses.replace(self, pixels=fn(self.pixels), drawn=drawn, labels=fn(self.labels))

    def to(self, device: torch.device) -> ImageBatch:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> ImageBatch:
        return self._map(lambda t: t.pin_memory())

    def tensors(self) -> list[torch.Tensor]:
        return [self.pixels, *self.drawn, self.labels]

    def without_labels(self, rows: torch.Tensor) -> ImageBatch:
        return dataclasses.replace(self, labels=self.labels.masked_fill(rows, IGNORE_INDEX))
