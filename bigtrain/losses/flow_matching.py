"""The flow-matching loss (``train.objective: flow-matching``): each example's mean squared error of the predicted
velocity against noise minus clean latents, weighted by its sigma as diffusers' ``compute_loss_weighting_for_sd3``
(``data/noising.py`` draws the timesteps and noises the latents). With ``train.precondition_outputs`` (SD3's script's
default), the prediction is made a denoised estimate first (prediction x -sigma + the noisy input) and compared with
the clean latents, as ``train_dreambooth_sd3.py`` computes it."""

from __future__ import annotations

import math

import torch

from bigtrain.data.noising import FlowMatching


def weighting(fm: FlowMatching, sigmas: torch.Tensor) -> torch.Tensor:
    """diffusers' ``compute_loss_weighting_for_sd3``."""
    if fm.weighting_scheme == "sigma_sqrt":
        return (sigmas**-2.0).float()
    if fm.weighting_scheme == "cosmap":
        return 2 / (math.pi * (1 - 2 * sigmas + 2 * sigmas**2))
    return torch.ones_like(sigmas)


def per_example_losses(fm: FlowMatching, prediction: torch.Tensor, target: torch.Tensor, sigmas: torch.Tensor):
    """Each example's weighted mean squared error (fp32), [B]."""
    w = weighting(fm, sigmas.float()).view(-1, *([1] * (target.dim() - 1)))
    return (w * (prediction.float() - target.float()) ** 2).reshape(target.shape[0], -1).mean(1)


class FlowMatchingLoss:
    """The objective of a micro-batch of noised examples (``data/encoded_images.py``): each example's weighted mean
    squared error summed over the examples (the engine divides by the global batch's), an evaluation filler
    (label IGNORE_INDEX) adding nothing."""

    per_forward_weight = 0.0
    metric_names: tuple[str, ...] = ()

    def __init__(self, flow: FlowMatching) -> None:
        self.flow = flow

    def count(self, labels: torch.Tensor) -> int:
        from bigtrain.data.labels import labelled_positions

        return labelled_positions(labels)  # an example each

    def loss_sum(self, prediction: torch.Tensor, batch: object) -> torch.Tensor:
        from bigtrain.data.labels import IGNORE_INDEX

        if batch.preconditioned:  # type: ignore[attr-defined]  # SD3's script: the denoised estimate, as it computes it
            s = batch.sigmas.view(-1, *([1] * (prediction.dim() - 1))).to(prediction.dtype)  # type: ignore[attr-defined]
            prediction = prediction * (-s) + batch.inputs["hidden_states"]  # type: ignore[attr-defined]
        losses = per_example_losses(self.flow, prediction, batch.target, batch.sigmas)  # type: ignore[attr-defined]
        kept = batch.labels != IGNORE_INDEX  # type: ignore[attr-defined]
        return (losses * kept).sum()

    def __call__(self, output: object, batch: object) -> object:
        from bigtrain.losses.base import Terms

        return Terms(self.loss_sum(output.sample, batch))  # type: ignore[attr-defined]

    def eval_sums(self, output: object, batch: object, terms: object) -> torch.Tensor:
        return output.sample.new_zeros(0, dtype=torch.float32)  # type: ignore[attr-defined]

    def eval_metrics(self, loss: float, sums: torch.Tensor, count: int) -> dict[str, float]:
        return {"eval_examples": count}

    def step_metrics(self, sums: torch.Tensor, count: int) -> dict[str, float]:
        return {}
