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


# the published pipelines' frozen parts, by the transformer's type and text widths (T5 states, pooled CLIP):
# FLUX.1's (T5-v1.1-XXL's encoder, CLIP ViT-L/14's text model, FLUX's VAE) and SD3.5's (the same T5 and VAE, with
# CLIP-L's and OpenCLIP bigG's text models with projection), counted by building transformers' T5EncoderModel and
# CLIPTextModel(WithProjection) and diffusers' AutoencoderKL from their published configs on meta: (name, params,
# what it reads)
T5_XXL, VAE_16 = ("T5-XXL", 4_762_310_656, "t5"), ("VAE", 83_819_683, "pixels")
FROZEN = {
    ("flux_transformer", 4096, 768): (T5_XXL, ("CLIP-L", 123_060_480, "clip"), VAE_16),
    ("sd3_transformer", 4096, 2048): (T5_XXL, ("CLIP-G", 694_659_840, "clip"), ("CLIP-L", 123_650_304, "clip"), VAE_16),
}


def published_frozen_parts(model_type: str | None, init: dict[str, Any]) -> list[list[Any]] | None:
    """The published pipeline's frozen parts for a transformer of its type and text widths (None: none known)."""
    known = FROZEN.get((model_type, init.get("joint_attention_dim"), init.get("pooled_projection_dim")))
    return None if known is None else [list(part) for part in known]
