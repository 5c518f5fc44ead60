"""The recipe keys of diffusion transformers (``model.task: text-to-image``, ``train.objective: flow-matching``),
kept apart from ``schema.py``, which reads them into its ``train`` section. The names and defaults are diffusers'
training scripts' (``train_dreambooth_flux.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bigtrain.config.schema_fields import doc

Weighting = Literal["none", "logit_normal", "mode", "sigma_sqrt", "cosmap"]


@dataclass
class DiffusionKeys:
    """``train.`` keys of the flow-matching objective."""

    weighting_scheme: Weighting | None = doc(
        "flow-matching: how timesteps are drawn and weighted: none (uniform), logit_normal, mode, sigma_sqrt or "
        "cosmap (uniform draws, weighted loss), as diffusers' scripts take --weighting_scheme; unset: the family's "
        "script's default (FLUX: none; SD3: logit_normal).",
        default=None,
    )
    logit_mean: float = doc("flow-matching: the mean of weighting_scheme=logit_normal.", default=0.0)
    logit_std: float = doc("flow-matching: the standard deviation of weighting_scheme=logit_normal.", default=1.0)
    mode_scale: float = doc("flow-matching: the scale of weighting_scheme=mode.", default=1.29)
    precondition_outputs: bool | None = doc(
        "flow-matching: compare the prediction made a denoised estimate (prediction x -sigma + the noisy input) with "
        "the clean latents, as diffusers' SD3 script's --precondition_outputs; unset: the family's script's default "
        "(SD3: true; FLUX: false).",
        default=None,
    )
    guidance_scale: float = doc(
        "flow-matching: the guidance a guidance-distilled transformer (FLUX.1-dev: guidance_embeds) is given in "
        "training.",
        default=3.5,
    )
