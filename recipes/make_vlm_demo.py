"""``python recipes/make_vlm_demo.py FOLDER [FAMILY]``: a tiny vision-language model to try docs/vision-language.md
offline in a second. With your own model, skip it and point the recipe at the model's folder.

FOLDER holds a tiny, randomly initialised model of FAMILY (``llava`` by default, ``qwen2_5_vl`` or ``idefics3``:
2 vision blocks and 2 decoder layers of width 32) saved with ``save_pretrained``, and its processor as
``processor.save_pretrained`` writes one: bigtrain's byte-level tokenizer with the family's image tokens and a ChatML
chat template, and the family's image processor at a small resolution (a 32 x 32 picture makes 16 image tokens; LLaVA
crops it to 16 x 16). LLaVA's and Idefics3's processors need no torchvision (Qwen-VL's video processor does:
``transformers.pipeline`` then needs it installed; bigtrain's training does not). The tests build their models with
``save_tiny_vlm``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# ChatML with image items: the placeholder is each family's own (what its processor expands)
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}PLACEHOLDER"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = {  # the language model: a 2-layer decoder of width 32
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
FAMILIES = ("qwen2_5_vl", "idefics3", "llava")


def _qwen2_5_vl(tokens: Any) -> tuple[dict, Any, dict, list[str]]:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    text = {**TEXT, "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0}}
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 4,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 32,
        "fullatt_block_indexes": [1],
        "window_size": 8,
    }
    ids = {
        "image_token_id": tokens("<|image_pad|>"),
        "video_token_id": tokens("<|video_pad|>"),
        "vision_start_token_id": tokens("<|vision_start|>"),
        "vision_end_token_id": tokens("<|vision_end|>"),
    }
    # 16 x 16 to 32 x 32 pixels: 4 to 16 image tokens after the 2 x 2 merge of 4-pixel patches
    images = Qwen2VLImageProcessorPil(
        patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=16 * 16, max_pixels=32 * 32
    )
    config = {"text_config": text, "vision_config": vision, **ids}
    return config, images, {"processor_class": "Qwen2_5_VLProcessor"}, ["<|vision_start|><|image_pad|><|vision_end|>"]


def _idefics3(tokens: Any) -> tuple[dict, Any, dict, list[str]]:
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    vision = {**VISION, "image_size": 16, "patch_size": 4}
    config = {"text_config": {"model_type": "llama", **TEXT}, "vision_config": vision, "scale_factor": 2}
    config["image_token_id"] = tokens("<image>")
    # images split into 16-pixel tiles plus the whole image scaled down: 4 tokens per tile
    images = Idefics3ImageProcessorPil(
        do_image_splitting=True, size={"longest_edge": 32}, max_image_size={"longest_edge": 16}
    )
    return config, images, {"processor_class": "Idefics3Processor", "image_seq_len": 4}, ["<image>"]


def _llava(tokens: Any) -> tuple[dict, Any, dict, list[str]]:
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    vision = {**VISION, "model_type": "clip_vision_model", "image_size": 16, "patch_size": 4, "projection_dim": 32}
    config = {
        "text_config": {"model_type": "llama", **TEXT},
        "vision_config": vision,
        "image_token_id": tokens("<image>"),
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
    }
    images = CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor = {
        "processor_class": "LlavaProcessor",
        "patch_size": 4,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
    }
    return config, images, processor, ["<image>"]


SPECIAL = {
    "qwen2_5_vl": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
    "idefics3": ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]
    + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)],
    "llava": ["<image>"],
}
BUILDERS = {"qwen2_5_vl": _qwen2_5_vl, "idefics3": _idefics3, "llava": _llava}


def save_tiny_vlm(folder: str | Path, family: str = "llava", seed: int = 0) -> Path:
    """A tiny ``family`` model and its processor in ``folder`` (see the module's docstring)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    from bigtrain.data.tokenizer import save_byte_tokenizer

    root = Path(folder)
    save_byte_tokenizer(root)
    tokenizer = AutoTokenizer.from_pretrained(root)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *SPECIAL[family]]})
    config, images, processor, (placeholder,) = BUILDERS[family](tokenizer.convert_tokens_to_ids)
    config["text_config"]["vocab_size"] = len(tokenizer)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):  # the byte tokenizer's, not the family's
        config["text_config"][name] = tokenizer.pad_token_id
    hf_config = AutoConfig.for_model(family, **config)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(hf_config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")  # an answer ends its turn
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    images.save_pretrained(root)
    (root / "chat_template.jinja").write_text(TEMPLATE.replace("PLACEHOLDER", placeholder))
    (root / "processor_config.json").write_text(json.dumps(processor, indent=2))
    return root


def save_pictures(folder: Path, count: int = 4, seed: int = 99) -> list[str]:
    """``count`` pictures of the built-in shapes the training set does not hold (another seed), as PNG files; returns
    what each shows."""
    from PIL import Image

    from bigtrain.data.synthetic_images import CLASSES, shapes

    folder.mkdir(parents=True, exist_ok=True)
    images, labels = shapes(count=count, seed=seed)
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / f"{i}.png")
    return [CLASSES[label] for label in labels]


if __name__ == "__main__":
    where = sys.argv[1] if len(sys.argv) > 1 else "vlm_demo"
    family = sys.argv[2] if len(sys.argv) > 2 else "llava"
    save_tiny_vlm(where, family)
    shown = save_pictures(Path(where) / "pictures")
    print(f"wrote a tiny {family} model and its processor to {where}, and pictures 0-3.png of: {', '.join(shown)}")
