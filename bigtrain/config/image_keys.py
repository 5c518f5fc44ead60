"""The recipe keys of image data (image classification, image-text-to-text, text-to-image), kept apart from
``schema.py``, which reads them into its ``data`` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bigtrain.config.schema_fields import doc


@dataclass
class ImageDataKeys:
    """``data.`` keys of images."""

    image_field: str = doc(
        "Image classification: the HF dataset column holding the image; image-text-to-text: the column holding each "
        "conversation's images, in the order of its image placeholders (when its messages do not name them).",
        default="image",
    )
    processor: str | None = doc(
        "Image-text-to-text: the local folder of the model's processor (image processor, tokenizer, chat template); "
        "unset: the model folder.",
        default=None,
    )
    min_pixels: int | None = doc(
        "Image-text-to-text, families with dynamic resolution (Qwen-VL): the fewest pixels an image is resized to; "
        "unset: the processor's own.",
        default=None,
    )
    max_pixels: int | None = doc(
        "Image-text-to-text, families with dynamic resolution (Qwen-VL): the most pixels an image is resized to "
        "(its image tokens grow with them); unset: the processor's own.",
        default=None,
    )
    image_size: int | None = doc(
        "Image classification: the side of the square the model sees, in pixels; unset: the model folder's image "
        "processor's (preprocessor_config.json), else the model config's image_size (ViT's); else it is needed. "
        "Text-to-image: the side images are trained at (default 512); with aspect_buckets, the buckets' area.",
        default=None,
    )
    aspect_buckets: bool = doc(
        "Text-to-image: keep each image's aspect ratio, roughly, in buckets of at most image_size² pixels (sides "
        "multiples of image_size/8, ratios up to 2) instead of cropping it square; each global batch comes from "
        "one bucket (docs/diffusion.md).",
        default=False,
    )
    augment: Literal["crop_flip", "none"] = doc(
        "Image classification: crop_flip (torchvision's reference training: random-resized crop and horizontal "
        "flip, seeded per image and epoch, the same whatever the plan) or none (resize and centre crop, as "
        "evaluation).",
        default="crop_flip",
    )
