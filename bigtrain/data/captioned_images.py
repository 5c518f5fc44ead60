"""Images with captions for a text-to-image model (``model.task: text-to-image``), from a folder as diffusers'
training scripts read one:

- a ``metadata.jsonl`` (or ``metadata.csv``) beside the images, a row per image with its ``file_name`` (a path
  relative to the metadata's folder) and its caption in ``data.caption_field`` (default: the first of ``text``,
  ``caption``, ``prompt`` the rows have): what ``datasets.load_dataset("imagefolder")`` reads;
- else a ``.txt`` file beside each image holding its caption (the kohya / SimpleTuner layout);

or a local HF dataset with an image column (a ``datasets.Image`` feature) and a caption column: a ``save_to_disk``
folder (its ``data.split``), or ``.parquet``/``.arrow`` files, a glob of them (``data/records.py``). Its pictures
are read by index from the memory-mapped Arrow files, one batch at a time, never all at once.

An image without a caption, a metadata row naming a missing file, or a folder with neither layout is one line naming
the file and what would work. Every image's header is checked once (the listing is kept in the data cache's index).
Pixels are made as the scripts make them: the shorter side resized to ``data.image_size`` (bilinear), the centre
cropped square, scaled to [-1, 1]; or, with ``data.aspect_buckets``, resized to cover the bucket nearest the
image's aspect ratio and cropped to it (``data/aspect_buckets.py``).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigtrain.data.images import IMAGE_SUFFIXES
from bigtrain.data.records import is_dataset_path, open_dataset
from bigtrain.errors import ConfigError

METADATA = ("metadata.jsonl", "metadata.csv")
CAPTION_FIELDS = ("text", "caption", "prompt")


@dataclass(frozen=True)
class Captioned:
    """The images and their captions, in the source's order."""

    paths: list[Path]  # the image files; of a HF dataset, its Arrow files (what the data cache is keyed by)
    captions: list[str]
    layout: str  # "metadata.jsonl", "metadata.csv", ".txt files" or "HF dataset"
    rows: Any = None  # a HF dataset whose image_column holds the pictures (None: each path is one)
    image_column: str = ""

    def picture(self, i: int) -> Any:
        """The ``i``-th image as a PIL image (the caller closes it)."""
        from PIL import Image

        return Image.open(self.paths[i]) if self.rows is None else self.rows[i][self.image_column]


def list_captioned(key: str, folder: Path, caption_field: str | None = None, split: str = "train") -> Captioned:
    """Every image of ``folder`` (or a HF dataset's) with its caption (module docstring)."""
    if is_dataset_path(str(folder)):
        return _from_dataset(key, str(folder), caption_field, split)
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


def _from_dataset(key: str, path: str, caption_field: str | None, split: str) -> Captioned:
    import datasets

    data = open_dataset(key, path, split)
    images = [name for name, feature in data.features.items() if isinstance(feature, datasets.Image)]
    if not images:
        raise ConfigError(
            f"{key}={path!r} has no image column (a datasets.Image feature); its columns are "
            f"{', '.join(data.column_names)}: cast the pictures' column with datasets.Image()"
        )
    field = caption_field or next((f for f in CAPTION_FIELDS if f in data.column_names), None)
    if field is None:
        raise ConfigError(
            f"{key}={path!r} has no caption column ({', '.join(CAPTION_FIELDS)}); its columns are "
            f"{', '.join(data.column_names)}"
        )
    captions = data[field]
    for number, caption in enumerate(captions):
        if not isinstance(caption, str) or not caption.strip():
            raise ConfigError(f"{key}={path!r}: record {number} has no caption in {field!r}")
    files = sorted({Path(f["filename"]) for f in data.cache_files})
    return Captioned(files, [c.strip() for c in captions], "HF dataset", data, images[0])
