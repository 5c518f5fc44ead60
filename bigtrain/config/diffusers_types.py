"""The diffusion transformers bigtrain knows, by name only (no torch, transformers or diffusers import: the task
registry and ``bigtrain plan`` of a preset read these)."""

from __future__ import annotations

from typing import Any

# our model type -> the diffusers class it builds
CLASSES = {"flux_transformer": "FluxTransformer2DModel", "sd3_transformer": "SD3Transformer2DModel"}
# FLUX's attention projections: peft's adapters on them (the scripts' --lora_layers default); the blocks' linear names
# would match whole blocks, which peft cannot adapt
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
VAE_SCALE = 8  # FLUX's and SD3's VAE: 8 pixels a side per latent (the planner's and the simulator's image tokens)


def is_diffusers_config(raw: dict[str, Any]) -> bool:
    """Whether a config dict is a diffusers model's (its ``_class_name``) or one of ours (its model type)."""
    return "_class_name" in raw or raw.get("model_type") in CLASSES
