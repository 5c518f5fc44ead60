"""Image classification data: the built-in shapes, an image folder (one sub-folder per class) or a saved HF dataset
with an image and a label column, read one micro-batch at a time and preprocessed as the model's image processor
says (size, mean, std).

Training images are augmented as torchvision's reference classification recipe does (``data.augment: crop_flip``:
random-resized crop and horizontal flip, written here on tensors: see ``random_resized_crop_box``); the randomness of
each image is seeded by ``train.seed`` and the image's position in the endless global order
(``GlobalOrder.micro_positions``), which is the same for every plan: step k trains on the same pixels whatever the
split into ranks and micro-batches, and an image seen again in the next epoch gets a new crop. Evaluation images are
resized and centre-cropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigtrain.config.schema import DataConfig
from bigtrain.data import cache
from bigtrain.data.batch import ExampleBatch
from bigtrain.data.cache import cache_dir_of
from bigtrain.data.examples import IndexedExamples, label_indices
from bigtrain.data.image_index import folder_index
from bigtrain.data.pixels import rgb_array
from bigtrain.data.synthetic_images import CLASSES, shapes
from bigtrain.errors import ConfigError

BUILTIN_SHAPES = "builtin:shapes"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preprocessing:
    """What the model expects of an image (its image processor's settings, or the recipe's)."""

    size: int
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    @classmethod
    def of(cls, cfg: DataConfig, model_folder: str | None, hf_config: Any = None) -> Preprocessing:
        """``data.image_size`` over the model folder's image processor (preprocessor_config.json) over the config's
        own ``image_size`` (ViT's); mean and std from the processor, else ImageNet's."""
        processor = _processor_settings(model_folder)
        size = cfg.image_size or processor.get("size") or getattr(hf_config, "image_size", None)
        if not size:
            where = f"{model_folder} has no image processor (preprocessor_config.json)" if model_folder else (
                "a model built from model.config has no image processor"
            )  # fmt: skip
            raise ConfigError(
                f"data.image_size is needed: {where} to say what size the model sees; set data.image_size "
                "(e.g. 224 for ImageNet models, 32 for builtin:shapes)"
            )
        if size < 8:
            raise ConfigError(f"data.image_size={size} is too small; use at least 8 pixels (224 for ImageNet models)")
        return cls(int(size), processor.get("mean", IMAGENET_MEAN), processor.get("std", IMAGENET_STD))


def _processor_settings(model_folder: str | None) -> dict[str, Any]:
    if model_folder is None or not (Path(model_folder) / "preprocessor_config.json").is_file():
        return {}
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(model_folder, local_files_only=True)
    size = getattr(processor, "crop_size", None) or getattr(processor, "size", None) or {}
    side = size.get("height") or size.get("shortest_edge") if isinstance(size, dict) else size
    out: dict[str, Any] = {"size": side} if side else {}
    if getattr(processor, "image_mean", None) is not None:
        out.update(mean=tuple(processor.image_mean), std=tuple(processor.image_std))
    return out


@dataclass
class ImageExamples(IndexedExamples):
    """Images with one label each; ``read(i)`` decodes image ``i`` as [H, W, 3] uint8."""

    read: Callable[[int], np.ndarray]
    labels: np.ndarray  # [num_examples] int64
    class_names: list[str]
    preprocessing: Preprocessing
    description: str
    augment: bool = False
    seed: int = 0
    index: np.ndarray | None = None  # the examples these are (a split), in order; None: all
    cache_note: str | None = None  # an image folder's index: where in the data cache, and whether built now

    truncated = 0

    def subset(self, index: np.ndarray, description: str, augment: bool) -> ImageExamples:
        return replace(self, index=self.at(index), description=description, augment=augment)

    def micro_batch(self, rows: np.ndarray, seen: np.ndarray | None = None) -> ExampleBatch:
        """Examples ``rows`` (0-based among these) preprocessed, augmented when training (``seen``: each row's
        position in the global order, which seeds its augmentation)."""
        at = self.at(rows)
        p = self.preprocessing
        pictures = []
        for k, i in enumerate(at):
            image = torch.from_numpy(np.ascontiguousarray(self.read(int(i)))).permute(2, 0, 1)
            if seen is None or not self.augment:
                pictures.append(centre_crop(resize_shorter(image, p.size), p.size))
            else:
                pictures.append(crop_and_flip(image, p.size, _generator(self.seed, int(seen[k]))))
        mean = torch.tensor(p.mean, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(p.std, dtype=torch.float32).view(1, -1, 1, 1)
        pixels = (torch.stack(pictures) - mean) / std
        labels = torch.from_numpy(self.labels[at].astype(np.int64))
        return ExampleBatch({"pixel_values": pixels}, labels)  # pinned by the loader on the way to a GPU


def _generator(seed: int, seen: int) -> torch.Generator:
    """The random stream of the image at global position ``seen``: seeded by (train.seed, position) through
    splitmix64's mixing (distinct, well-spread seeds for neighbouring positions), nothing else's state touched."""
    z = (seed * 0x9E3779B97F4A7C15 + seen + 1) & 0xFFFF_FFFF_FFFF_FFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFF_FFFF_FFFF_FFFF
    return torch.Generator().manual_seed((z ^ (z >> 31)) & 0x7FFF_FFFF_FFFF_FFFF)


def crop_and_flip(image: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """torchvision's reference training transform: a random-resized crop to ``size`` x ``size``, then a horizontal
    flip with probability 1/2; [C, H, W] -> float in [0, 1]."""
    top, left, h, w = random_resized_crop_box(image.shape[1], image.shape[2], generator)
    out = resize(image[:, top : top + h, left : left + w], (size, size))
    return out.flip(-1) if torch.rand((), generator=generator) < 0.5 else out


# torchvision (the library the issue names for this) cannot be used here: the only wheels the package index serves
# are CUDA builds, whose extension does not load beside a CPU torch ("operator torchvision::nms does not exist" on
# import). The few lines below follow torchvision's RandomResizedCrop, Resize and CenterCrop, on float tensors.
CROP_SCALE = (0.08, 1.0)  # of the image's area (torchvision's defaults)
CROP_RATIO = (3 / 4, 4 / 3)  # width / height


def random_resized_crop_box(height: int, width: int, generator: torch.Generator) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a crop covering a random fraction of the area in ``CROP_SCALE`` with a log-uniform aspect
    ratio in ``CROP_RATIO``, drawn from ``generator``: ten tries, then the centre crop of the clamped ratio
    (torchvision's ``RandomResizedCrop.get_params``)."""
    area = height * width
    low, high = math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])
    for _ in range(10):
        draws = torch.rand(2, generator=generator).tolist()
        target = area * (CROP_SCALE[0] + (CROP_SCALE[1] - CROP_SCALE[0]) * draws[0])
        ratio = math.exp(low + (high - low) * draws[1])
        w = round((target * ratio) ** 0.5)
        h = round((target / ratio) ** 0.5)
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=generator))
            return top, left, h, w
    ratio = width / height
    if ratio < CROP_RATIO[0]:
        w, h = width, round(width / CROP_RATIO[0])
    elif ratio > CROP_RATIO[1]:
        h, w = height, round(height * CROP_RATIO[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def resize(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[C, H, W] uint8 or float -> [C, *size] float in [0, 1], bilinear with antialiasing."""
    x = image.float().div(255.0) if image.dtype == torch.uint8 else image.float()
    out = torch.nn.functional.interpolate(x[None], size=size, mode="bilinear", antialias=True, align_corners=False)
    return out[0].clamp(0.0, 1.0)


def resize_shorter(image: torch.Tensor, side: int) -> torch.Tensor:
    h, w = image.shape[1], image.shape[2]
    scale = side / min(h, w)
    return resize(image, (max(side, round(h * scale)), max(side, round(w * scale))))


def centre_crop(image: torch.Tensor, side: int) -> torch.Tensor:
    h, w = image.shape[1], image.shape[2]
    top, left = (h - side) // 2, (w - side) // 2
    return image[:, top : top + side, left : left + side]


def load_image_examples(cfg: DataConfig, key: str, path: str, preprocessing: Preprocessing, seed: int) -> ImageExamples:
    """``path`` (data.path or data.eval_path) as image examples: builtin:shapes, an image folder or a saved HF
    dataset (``datasets.save_to_disk``) with ``data.image_field`` and ``data.label_field`` columns."""
    if path == BUILTIN_SHAPES:
        images, labels = shapes()
        where = f"{path} ({len(labels)} drawn images of {images.shape[1]} px, {len(CLASSES)} classes)"
        return ImageExamples(images.__getitem__, labels, list(CLASSES), preprocessing, where, seed=seed)
    if path.startswith("builtin:"):
        raise ConfigError(f"{key}={path!r} is not a built-in image set; use {BUILTIN_SHAPES}")
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(
            f"{key}={path!r} is not a folder; give an image folder (one sub-folder of images per class), a saved HF "
            f"dataset with {cfg.image_field!r} and {cfg.label_field!r} columns, or {BUILTIN_SHAPES}"
        )
    if (folder / "dataset_info.json").is_file() or (folder / "dataset_dict.json").is_file():
        return _hf_images(cfg, key, folder, preprocessing, seed)
    return _image_folder(cfg, key, folder, preprocessing, seed)


def _image_folder(cfg: DataConfig, key: str, folder: Path, preprocessing: Preprocessing, seed: int) -> ImageExamples:
    """The folder's index from the data cache (data/image_index.py): listed and checked once."""
    index = folder_index(cache_dir_of(cfg), key, folder, lambda: _list_images(key, folder))
    where = f"{folder} ({len(index)} images, {len(index.classes)} classes)"
    return ImageExamples(
        lambda i: _decode(index.path(i)), index.labels, index.classes, preprocessing, where, seed=seed,
        cache_note=index.note,
    )  # fmt: skip


def _list_images(key: str, folder: Path) -> tuple[list[str], list[Path], np.ndarray]:
    """The classes (sub-folders with images, sorted), every image's path and label, each file's header checked."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    files = {c: sorted(f for f in (folder / c).rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES) for c in classes}
    nested = [c for c in classes if files[c] and not any(f.parent == folder / c for f in files[c])]
    if nested and len(nested) == len(classes):  # root/train/cat, root/val/cat: the splits, not the classes
        inner = sorted(p.name for p in (folder / nested[0]).iterdir() if p.is_dir())
        raise ConfigError(
            f"{key}={str(folder)!r}: its sub-folders ({', '.join(nested[:4])}) hold no image themselves, only "
            f"folders ({', '.join(inner[:4])}); point data.path at the folder whose sub-folders are the classes "
            f"(e.g. {folder / nested[0]})"
        )
    classes = [c for c in classes if files[c]]
    if len(classes) < 2:
        found = f"only {classes[0]!r}" if classes else "none"
        raise ConfigError(
            f"{key}={str(folder)!r} has {found} as a class folder with images; an image folder needs one sub-folder "
            f"of images ({', '.join(IMAGE_SUFFIXES)}) per class, at least two"
        )
    paths = [f for c in classes for f in files[c]]
    labels = np.array([i for i, c in enumerate(classes) for _ in files[c]], dtype=np.int64)
    # headers only: a file that is no image fails now, named, not hours into the run
    for f in cache.counted(paths, key, "checking", "images"):
        _check_image(key, f)
    return classes, paths, labels


def _check_image(key: str, path: Path) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise ConfigError(f"{key}: {path} is not a readable image ({e}); remove or replace it") from e


def _decode(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        return rgb_array(image)


def _hf_images(cfg: DataConfig, key: str, folder: Path, preprocessing: Preprocessing, seed: int) -> ImageExamples:
    import datasets

    data = datasets.load_from_disk(str(folder))
    if isinstance(data, datasets.DatasetDict):
        if cfg.split not in data:
            raise ConfigError(f"{key}={str(folder)!r} has no split {cfg.split!r} (data.split); it has {list(data)}")
        data = data[cfg.split]
    for field_key, name in (("data.image_field", cfg.image_field), ("data.label_field", cfg.label_field)):
        if name not in data.column_names:
            raise ConfigError(f"{key}={str(folder)!r} has no column {name!r} ({field_key}); it has {data.column_names}")
    feature = data.features[cfg.label_field]
    raw = list(data[cfg.label_field])
    if hasattr(feature, "names"):  # a ClassLabel column: its names, in its order
        classes, labels = list(feature.names), np.array(raw, dtype=np.int64)
        if len(labels) and labels.min() < 0:  # -1: an unlabelled row (a test split's)
            raise ConfigError(
                f"{key}: {cfg.label_field} holds the label {int(labels.min())} (unlabelled rows): train on a labelled "
                "split (data.split) or drop those rows"
            )
    else:
        classes, labels = label_indices(raw, key, cfg.label_field)
    images = data.select_columns([cfg.image_field])
    field = cfg.image_field
    where = f"{folder} ({len(labels)} images, {len(classes)} classes)"
    return ImageExamples(lambda i: rgb_array(images[i][field]), labels, classes, preprocessing, where,
                         seed=seed)  # fmt: skip
