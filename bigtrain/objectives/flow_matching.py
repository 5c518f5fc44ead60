"""``train.objective: flow-matching``: rectified flow as diffusers trains FLUX (``losses/flow_matching.py``): the
transformer predicts the velocity (noise minus clean latents) of latents noised to a drawn timestep; each example's
weighted mean squared error, summed over the micro-batch and normalised by the examples of the whole global batch.
Its timestep density and weighting are ``train.weighting_scheme`` and its companions."""

from __future__ import annotations

from typing import Any

from bigtrain.config.capabilities.frozen_parts import ROLE
from bigtrain.config.setup import DENOISED
from bigtrain.errors import ConfigError
from bigtrain.objectives.spec import ObjectiveSpec


def make(built: Any, train: Any) -> Any:
    from bigtrain.data.noising import flow_of
    from bigtrain.losses.flow_matching import FlowMatchingLoss

    # the loss reads the weighting only (the shift is in the data's sigmas); an unset scheme is the family's default,
    # none (FLUX) or logit_normal (SD3), which both weight every example 1, as "none" does here
    return FlowMatchingLoss(flow_of(train))


def attach(engine: Any, options: Any, train: Any) -> None:
    """The pipeline's frozen parts, where the plan runs them during training (``parallel.frozen_parts``)."""
    from bigtrain.roles.frozen_parts import attach_frozen_parts

    attach_frozen_parts(engine, options, train)


def check(cfg: Any) -> None:
    if cfg.train.logit_std <= 0:
        raise ConfigError(f"train.logit_std={cfg.train.logit_std} must be > 0 (diffusers' default is 1.0)")


OBJECTIVE = ObjectiveSpec(
    name="flow-matching",
    summary="rectified flow (FLUX, SD3): the velocity of noised latents, timesteps by train.weighting_scheme",
    reads=DENOISED,
    make=make,
    check=check,
    roles=(ROLE,),  # the pipeline's VAE and text encoders, placed by parallel.frozen_parts
    attach=attach,
    keys=(
        "train.weighting_scheme",
        "train.logit_mean",
        "train.logit_std",
        "train.mode_scale",
        "train.guidance_scale",
        "train.precondition_outputs",
        "parallel.frozen_parts",
    ),  # fmt: skip
    refusal=lambda task: (
        f"train.objective=flow-matching trains a diffusion transformer, which a {task} model is not; use "
        "model.task=text-to-image with a diffusers pipeline folder"
    ),
)
