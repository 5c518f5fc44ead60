"""What the planner needs of a vision-language model's vision side: its parameters, and what one image costs.

A vision-language model is its language model (``ModelStats`` of its text config: formulas or the block probe) plus
a vision tower and a projector, which turn each image into image tokens of the language model's rows. The tower's
and the projector's parameters are counted on the model built on the meta device (``config/model_parts.py`` names
the parts). What one image costs follows from how the family's processor shapes it:
- Qwen-VL (dynamic resolution): the image resized to a multiple of patch x merge pixels per side, one patch per
  patch² pixels, one image token per merge² patches;
- Idefics3 / SmolVLM: split into tiles of the tower's size plus the whole image scaled down (when split), each tile
  (size/patch)² patches, scale_factor² patches per image token;
- the others (LLaVA, Gemma 3, ...): resized to the tower's fixed size: (size/patch)² patches, each an image token
  unless the config says how many the projector pools them to (Gemma 3's mm_tokens_per_image).
The tower is a transformer encoder over the patches: what a block keeps for backward per patch is counted tensor by
tensor as transformers' blocks save it (a gated MLP and rotary attention where its blocks have them, Qwen-VL's;
LayerNorm and a GELU MLP otherwise, CLIP's and SigLIP's), SDPA keeping no patch x patch scores; the
projector keeps its input and its hidden layer per image token. FLOPs: 2 per parameter per patch, attention's 4·P·d
per block (windowed attention counted as full), the projector's 2 per parameter per token. The memory terms are held
to bigtrain's own step simulated on fake tensors at real widths (tests/distributed/test_vlm_memory.py).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

DEFAULT_IMAGE_SIZE = 448  # pixels per side the planner assumes when none is given


@dataclass(frozen=True)
class VisionStats:
    tower_params: int  # the vision tower's parameters (the projector's not included)
    projector_params: int
    blocks: int  # the tower's blocks
    block_params: int  # one of them (what FSDP2 gathers at a time)
    width: int  # the tower's hidden size
    heads: int
    ffn: int  # its MLP's inner width
    gated: bool  # a gated (SwiGLU) MLP and RMSNorm (Qwen-VL); else LayerNorm and a GELU MLP
    quick_gelu: bool  # the GELU is CLIP's x·sigmoid(1.702x) (a sigmoid's output kept too), not one op
    projector_in: int  # the projector's input width per image token
    projector_out: int  # the language model's width
    geometry: str  # "dynamic" (Qwen-VL), "tiles" (Idefics3, SmolVLM) or "fixed"
    patch: int  # pixels per patch side
    merge: int  # patches per image token along each side (Qwen-VL's merge, Idefics3's scale_factor), else 1
    tower_size: int  # the tower's input side for the fixed and tiled families (0: dynamic)
    pooled_tokens: int  # image tokens per image when the config fixes them (Gemma 3), else 0

    @property
    def params(self) -> int:
        return self.tower_params + self.projector_params

    def patches(self, image_size: int) -> int:
        """Patches the tower sees for one image of ``image_size`` pixels per side."""
        if self.geometry == "dynamic":
            unit = self.patch * self.merge
            side = max(unit, round(image_size / unit) * unit)
            return (side // self.patch) ** 2
        per_tile = (self.tower_size // self.patch) ** 2
        if self.geometry == "tiles":
            tiles = math.ceil(image_size / self.tower_size) ** 2
            return per_tile * (tiles + (1 if tiles > 1 else 0))
        return per_tile

    def tokens(self, image_size: int) -> int:
        """Image tokens one image of ``image_size`` pixels per side becomes in the language model's row."""
        if self.pooled_tokens:
            return self.pooled_tokens
        return self.patches(image_size) // (self.merge**2)

    def saved_bytes(
        self, a: int, image_size: int, tower_trains: bool, projector_trains: bool, checkpointing: str = "none"
    ) -> int:
        """Bytes kept for backward for one image in a compute dtype of ``a`` bytes: the tower's blocks when the
        tower trains, the projector's when it trains or the tower does (its gradient flows through it)."""
        out = 0
        if tower_trains:
            out += self.blocks * self.patches(image_size) * self.block_bytes_per_patch(a, checkpointing)
        if tower_trains or projector_trains:
            out += self.tokens(image_size) * a * (self.projector_in + 2 * self.projector_out)
        return out

    def block_bytes_per_patch(self, a: int, checkpointing: str = "none") -> int:
        """What one tower block keeps per patch with SDPA, each tensor as transformers' blocks save it (listed on fake
        tensors, transformers 5.24; tests/distributed/test_vlm_memory.py holds the whole towers to the simulated step):
        a gated block (Qwen-VL: RMSNorm, rotary, SwiGLU): two norms' fp32 input, rsqrt, normalised input and output
        (2·(4h + 2ah + 4)); the fused qkv projection's output (3ah), the rotated q and k (2ah), attention's output and
        the copy its transpose makes for the output projection (2ah), its log-sum-exp (4 per head); the MLP's gate,
        activation, up and product (4a·f). A LayerNorm block (CLIP, SigLIP): two norms' input, output and statistics
        (4ah + 4a), q, k, v and attention's output (4ah; the output projection reads the output in place), the
        log-sum-exp, the MLP's pre-activation and activation (2a·f; quick_gelu's sigmoid a third). Full checkpointing
        keeps the block's input (ah); selective the matmuls' outputs (q, k, v, o; the MLP's projections), attention's
        output and log-sum-exp, and the input."""
        h, f, heads = self.width, self.ffn, self.heads
        if checkpointing == "full":
            return a * h
        mlp_outputs = (2 * a * f + a * h) if self.gated else (a * f + a * h)
        if checkpointing == "selective":
            return 4 * a * h + mlp_outputs + a * h + 4 * heads + a * h
        if self.gated:
            return 2 * (4 * h + 2 * a * h + 4) + 7 * a * h + 4 * heads + 4 * a * f
        return 4 * a * h + 4 * a + 4 * a * h + 4 * heads + (3 if self.quick_gelu else 2) * a * f

    def activation_bytes(self, plan: Any, workload: Any) -> int:
        """What one rank's micro-batch of images keeps for backward in the tower and the projector."""
        tower, projector = trains(workload)
        per_image = self.saved_bytes(
            workload.dtype_bytes, image_size_of(workload), tower, projector, plan.activation_checkpointing
        )
        return round(per_image * workload.images_per_row * plan.micro_batch_size)

    def step_flops(self, plan: Any, workload: Any) -> float:
        """FLOPs of one step's images over all ranks: a forward per image; its backward (twice the forward) when the
        tower trains, and once more its forward under full checkpointing."""
        tower, _ = trains(workload)
        passes = 1.0 + (2.0 + (plan.activation_checkpointing == "full")) * tower
        images = workload.images_per_row * workload.global_batch_size
        return passes * images * self.forward_flops(image_size_of(workload))

    def forward_flops(self, image_size: int) -> float:
        """Forward FLOPs of the tower and the projector for one image."""
        p = self.patches(image_size)
        attention = 4.0 * p * p * self.width * self.blocks
        return 2.0 * self.tower_params * p + attention + 2.0 * self.projector_params * self.tokens(image_size)


def vision_stats(hf_config: Any) -> VisionStats:
    """``hf_config``'s vision side (cached per config)."""
    return _counted(json.dumps(hf_config.to_dict(), sort_keys=True, default=str))


@lru_cache(maxsize=16)
def _counted(config_json: str) -> VisionStats:
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from bigtrain.config.hf import decoder_blocks, is_linear
    from bigtrain.config.model_parts import part_modules

    fields = json.loads(config_json)
    hf_config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(hf_config)
    parts = part_modules(model)
    tower, projector = model.get_submodule(parts["vision_tower"]), model.get_submodule(parts["projector"])
    in_projector = {id(p) for p in projector.parameters()}
    units = [block for _, _, block in decoder_blocks(tower)]
    kind = Counter(type(u) for u in units).most_common(1)[0][0]  # the repeated block (not the embeddings' unit)
    blocks = [u for u in units if type(u) is kind]
    first = blocks[0]
    linears = [m for m in projector.modules() if is_linear(m)]
    vision = hf_config.vision_config
    width = vision.hidden_size
    heads = getattr(vision, "num_heads", None) or vision.num_attention_heads
    if hasattr(vision, "spatial_merge_size") and hasattr(vision, "temporal_patch_size"):
        geometry, merge, size = "dynamic", vision.spatial_merge_size, 0
    elif getattr(hf_config, "scale_factor", None) is not None:
        geometry, merge, size = "tiles", hf_config.scale_factor, vision.image_size
    else:
        geometry, merge, size = "fixed", 1, vision.image_size
    return VisionStats(
        tower_params=sum(p.numel() for p in tower.parameters() if id(p) not in in_projector),
        projector_params=sum(p.numel() for p in projector.parameters()),
        blocks=len(blocks),
        block_params=sum(p.numel() for p in first.parameters()),
        width=width,
        heads=heads,
        ffn=vision.intermediate_size,
        gated=any(name.endswith("gate_proj") for name, _ in first.named_modules()),
        quick_gelu=getattr(vision, "hidden_act", None) == "quick_gelu",
        projector_in=linears[0].in_features if linears else width,
        projector_out=linears[-1].out_features if linears else width,
        geometry=geometry,
        patch=vision.patch_size,
        merge=merge,
        tower_size=size,
        pooled_tokens=int(getattr(hf_config, "mm_tokens_per_image", 0) or 0),
    )


def image_size_of(workload: Any) -> int:
    return workload.image_size or DEFAULT_IMAGE_SIZE


def trains(workload: Any) -> tuple[bool, bool]:
    """(the tower trains, the projector trains): full fine-tuning of the parts model.freeze leaves; LoRA adapts the
    language model only."""
    if workload.adapters:
        return False, False
    return "vision_tower" not in workload.frozen, "projector" not in workload.frozen

