"""A diffusers transformer built from its config (``config/diffusers_config.py``): the model ``model.task:
text-to-image`` trains, constructed as diffusers constructs it (its class's ``from_config``), on ``meta`` for the
transforms to shard before any value is read, as bigtrain builds every model."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bigtrain.config.diffusers_config import DiffusersTransformerConfig
from bigtrain.errors import ConfigError


def diffusers_class(cfg: DiffusersTransformerConfig) -> Any:
    try:
        import diffusers
    except ImportError as e:
        raise ConfigError(
            f"model.task=text-to-image trains a diffusers model ({cfg.class_name}): pip install 'bigtrain[diffusion]'"
        ) from e
    return getattr(diffusers, cfg.class_name)


def construct(cfg: DiffusersTransformerConfig, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model of the config, its parameters in ``dtype`` (on the device the caller opened, ``meta`` for a build
    whose values come later)."""
    model = diffusers_class(cfg).from_config(cfg.diffusers_config())
    return model.to(dtype)
