"""Images with captions for a text-to-image model (``model.task: text-to-image``), from a folder as diffusers'
training scripts read one:

- a ``metadata.jsonl`` (or ``metadata.csv``) beside the images, a row per image with its ``file_name`` (a path
  relative to the metadata's folder) and its caption in ``data.caption_field`` (default: the first of ``text``,
  ``caption``, ``prompt`` the rows have): what ``datasets.load_dataset("imagefolder")`` reads;
- else a ``.txt`` file beside each image holding its caption (the kohya / SimpleTuner layout).

An image without a caption, a metadata row naming a missing file, or a folder with neither layout is one line naming
the file and what would work. Every image's header is checked once (the listing is kept in the data cache's index).
Pixels are made as the scripts make them: the shorter side resized to ``data.image_size`` (bilinear), the centre
cropped square, scaled to [-1, 1].
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from bigtrain.data.images import IMAGE_SUFFIXES, centre_crop, resize_shorter
from bigtrain.errors import ConfigError

METADATA = ("metadata.jsonl", "metadata.csv")
CAPTION_FIELDS = ("text", "caption", "prompt")


@dataclass(frozen=True)
class Captioned:
    """The folder's images and their captions, in file order."""

    paths: list[Path]
    captions: list[str]
    layout: str  # "metadata.jsonl", "metadata.csv" or ".txt files"


def list_captioned(key: str, folder: Path, caption_field: str | None = None) -> Captioned:
    """Every image of ``folder`` with its caption (module docstring)."""
    for name in METADATA:
        if (folder / name).is_file():
            return _from_metadata(key, folder / name, caption_field)
    images = sorted(f for f in folder.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise ConfigError(
            f"{key}={str(folder)!r} holds no image ({', '.join(IMAGE_SUFFIXES)}); give a folder of images with a "
            "metadata.jsonl (file_name and text per row) or a .txt caption beside each image"
        )
    captions = []
    for image in images:
        text = image.with_suffix(".txt")
        if not text.is_file():
            raise ConfigError(
                f"{key}: {image} has no caption: put it in {text.name} beside it, or list every image with its "
                f"caption in {folder / METADATA[0]} (file_name and text per row)"
            )
        captions.append(text.read_text(encoding="utf-8").strip())
    return Captioned(images, captions, ".txt files")


def _rows(path: Path) -> list[dict]:
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    rows = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}, line {line_no}: not JSON ({e.msg})") from e
    return rows


def _from_metadata(key: str, path: Path, caption_field: str | None) -> Captioned:
    rows = _rows(path)
    if not rows:
        raise ConfigError(f"{key}: {path} lists no image")
    field = caption_field or next((f for f in CAPTION_FIELDS if f in rows[0]), None)
    if field is None:
        raise ConfigError(
            f"{key}: {path}'s rows have no caption column ({', '.join(CAPTION_FIELDS)}); they have "
            f"{sorted(rows[0])}: set data.caption_field"
        )
    paths, captions = [], []
    for number, row in enumerate(rows, 1):
        where = f"{path}, row {number}"
        if "file_name" not in row:
            raise ConfigError(f"{key}: {where} has no file_name (the image's path beside {path.name})")
        image = path.parent / row["file_name"]
        if not image.is_file():
            raise ConfigError(f"{key}: {where} names {row['file_name']!r}, which is not a file in {path.parent}")
        caption = row.get(field)
        if not isinstance(caption, str) or not caption.strip():
            raise ConfigError(f"{key}: {where} ({row['file_name']}) has no caption in {field!r}")
        paths.append(image)
        captions.append(caption.strip())
    return Captioned(paths, captions, path.name)


def square_pixels(image: torch.Tensor, side: int) -> torch.Tensor:
    """[C, H, W] uint8 -> [C, side, side] float in [-1, 1]: the shorter side resized, the centre cropped."""
    return centre_crop(resize_shorter(image, side), side) * 2.0 - 1.0
