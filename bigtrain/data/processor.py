"""A vision-language model's processor (image processor + tokenizer + chat template), from a local folder.

transformers' ``AutoProcessor`` loads it. Some families' processors (Qwen-VL's, SmolVLM's) also hold a video
processor, which needs torchvision; training on images never calls it, so where torchvision is missing the
processor is built without it, from the folder's image processor, tokenizer, chat template and processor settings.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

from bigtrain.errors import ConfigError

EDGES = ("shortest_edge", "longest_edge")  # where Qwen-VL's image processors keep their pixel budget
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "chat_template.jinja", "chat_template.json")


def load_processor(folder: str, key: str, min_pixels: int | None = None, max_pixels: int | None = None) -> Any:
    """The processor saved in ``folder`` (``key`` names where the folder came from in errors), its tokenizer padding
    on the right (the labels are built for right padding), with ``min_pixels``/``max_pixels`` set on a dynamic-
    resolution image processor (Qwen-VL's pixel budget; refused for a family without one)."""
    path = Path(folder)
    if not (path / "preprocessor_config.json").is_file():
        raise ConfigError(
            f"{key}={folder!r} holds no processor (no preprocessor_config.json); point data.processor at a folder "
            "written by processor.save_pretrained (a vision-language model's own folder has one)"
        )
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
    except ImportError as e:
        if "torchvision" not in str(e).lower():
            raise
        processor = _without_video_processor(path, key)
    except (OSError, ValueError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{key}={folder!r}: transformers cannot load its processor ({first})") from e
    if not hasattr(processor, "image_processor"):
        raise ConfigError(
            f"{key}={folder!r} holds a {type(processor).__name__}, which has no image processor; an "
            "image-text-to-text model needs its own processor"
        )
    processor.tokenizer.padding_side = "right"
    _set_pixel_budget(processor.image_processor, key, min_pixels, max_pixels)
    return processor


def _without_video_processor(path: Path, key: str) -> Any:
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    settings = (
        json.loads((path / "processor_config.json").read_text()) if (path / "processor_config.json").is_file() else {}
    )
    name = settings.get("processor_class")
    family = getattr(transformers, name, None) if name else None
    if family is None:
        raise ConfigError(f"{key}={str(path)!r}: its processor needs torchvision, which is not installed")

    class ImagesOnly(family):  # the family's processor, its attributes less the video processor
        @classmethod
        def get_attributes(cls) -> list[str]:
            return [a for a in super().get_attributes() if a != "video_processor"]

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = family.__name__
    accepted = inspect.signature(family.__init__).parameters
    kwargs = {k: v for k, v in settings.items() if k in accepted and k not in ("image_processor", "tokenizer")}
    template = path / "chat_template.jinja"
    if template.is_file():
        kwargs["chat_template"] = template.read_text()
    return ImagesOnly(
        image_processor=AutoImageProcessor.from_pretrained(path, local_files_only=True),
        tokenizer=AutoTokenizer.from_pretrained(path, local_files_only=True),
        **kwargs,
    )


def pixel_budget(image_processor: Any) -> tuple[int, int] | None:
    """(fewest, most) pixels a dynamic-resolution image processor resizes an image into (Qwen-VL's: transformers
    keeps them as ``size``'s shortest_edge and longest_edge, in pixels), or None for a family that resizes every image
    to its own fixed size."""
    size = getattr(image_processor, "size", None)
    if not hasattr(image_processor, "merge_size") or size is None:
        return None
    low, high = (size.get(k) if isinstance(size, dict) else getattr(size, k, None) for k in EDGES)
    return None if low is None or high is None else (int(low), int(high))


def _set_pixel_budget(image_processor: Any, key: str, min_pixels: int | None, max_pixels: int | None) -> None:
    if min_pixels is None and max_pixels is None:
        return
    budget = pixel_budget(image_processor)
    if budget is None:
        raise ConfigError(
            f"data.min_pixels/data.max_pixels: the {type(image_processor).__name__} of {key} resizes every image to "
            "its own size (no pixel budget); leave them unset"
        )
    low = min_pixels if min_pixels is not None else budget[0]
    high = max_pixels if max_pixels is not None else budget[1]
    if low > high:
        raise ConfigError(f"data.min_pixels={low} is above data.max_pixels={high}; the budget needs min <= max")
    size = image_processor.size  # a dict, or transformers' SizeDict (a dataclass) once loaded
    if isinstance(size, dict):
        image_processor.size = {**size, "shortest_edge": low, "longest_edge": high}
    else:
        image_processor.size = dataclasses.replace(size, shortest_edge=low, longest_edge=high)


def placeholder_token(processor: Any) -> str:
    """The text a conversation holds once per image, which the processor expands into the image's tokens."""
    return getattr(processor, "boi_token", None) or processor.image_token


def image_token_ids(processor: Any) -> set[int]:
    """The ids of the tokens that stand for image features (never a label)."""
    ids = {getattr(processor, "image_token_id", None)}
    tokenizer = processor.tokenizer
    for name in ("image_token", "boi_token", "eoi_token", "fake_image_token", "global_image_tag"):
        token = getattr(processor, name, None)
        if isinstance(token, str):
            ids.add(tokenizer.convert_tokens_to_ids(token))
    return {i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id}
