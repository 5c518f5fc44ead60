"""Aspect-ratio buckets for a text-to-image model (``data.aspect_buckets: true``): images keep their shape, roughly,
instead of being cropped square.

- **The buckets** of ``data.image_size`` = s: every width x height whose sides are multiples of a step (the largest
  multiple of what the model's patches tile that divides s and is at most s / 8: 64 px at 512 for FLUX), with the
  largest height the area s x s allows at that width, and an aspect ratio of at most 2 (kohya's defaults), each
  turned both ways. At 512 px: 384x640, 448x576, 512x512, 576x448 and 640x384. No bucket has more pixels than the
  square, so the square is what the planner sizes.
- **An image** goes to the bucket nearest its aspect ratio (in log ratio), is resized to cover it (bilinear) and is
  centre cropped to it: the square bucket's pixels are those of the square crop.
- **The order.** A micro-batch stacks latents of one shape, so each global batch is drawn from one bucket; every
  plan's micro-batches then share its shape, and step k trains on the same examples whatever the plan. Epoch e,
  seeded by ``train.seed`` + e: each bucket's images in a shuffled order (``permutation``), cut into whole global
  batches (the rest wait for a later epoch's shuffle), then those batches shuffled together. Unshuffled
  (``data.shuffle: false``): each bucket's images in their order, the buckets one after another, the same every
  epoch (each bucket's last images, short of a batch, never train).
- **Held-out images** are evaluated bucket by bucket (``EvalLoader``), each bucket's last chunk filled out with
  copies that count nothing.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from bigtrain.data.images import resize

MAX_RATIO = 2.0  # the longer side over the shorter, at most


def bucket_step(image_size: int, multiple: int) -> int:
    """The buckets' side step: the largest multiple of ``multiple`` that divides ``image_size`` and is at most an
    eighth of it (64 px at 512 for FLUX's 16), else ``multiple``; so the square is itself a bucket."""
    steps = [s for s in range(multiple, image_size // 8 + 1, multiple) if image_size % s == 0]
    return max(steps, default=multiple)


def bucket_sizes(image_size: int, multiple: int) -> list[tuple[int, int]]:
    """The (width, height) buckets of ``image_size`` whose sides are multiples of ``multiple`` (module docstring),
    each turned both ways, the largest of each aspect ratio, from the tallest to the widest."""
    step = bucket_step(image_size, multiple)
    area = image_size * image_size
    largest: dict[float, tuple[int, int]] = {}
    for width in range(step, area // step + 1, step):
        height = area // width // step * step
        if height >= step and max(width / height, height / width) <= MAX_RATIO:
            for w, h in ((width, height), (height, width)):
                if w * h > math.prod(largest.get(w / h, (0, 0))):
                    largest[w / h] = (w, h)
    return [largest[ratio] for ratio in sorted(largest)]


def nearest_bucket(width: int, height: int, sizes: list[tuple[int, int]]) -> int:
    """The index of the bucket whose aspect ratio is nearest ``width / height`` (in log ratio; the first on a tie)."""
    ratio = math.log(width / height)
    return min(range(len(sizes)), key=lambda k: abs(math.log(sizes[k][0] / sizes[k][1]) - ratio))


def fitted_pixels(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[C, H, W] uint8 -> [C, height, width] float in [-1, 1] for ``size`` = (width, height): resized (bilinear)
    so that it covers the size, the centre cropped."""
    width, height = size
    h, w = image.shape[1], image.shape[2]
    scale = max(width / w, height / h)
    covering = resize(image, (max(height, round(h * scale)), max(width, round(w * scale))))
    top, left = (covering.shape[1] - height) // 2, (covering.shape[2] - width) // 2
    return covering[:, top : top + height, left : left + width] * 2.0 - 1.0


def epoch_batches(buckets: np.ndarray, batch: int, rng: np.random.Generator | None) -> np.ndarray:
    """One epoch's global batches, [batches, batch] row indices, of rows whose buckets are ``buckets``: each bucket's
    rows (shuffled by ``rng``; None: in order) cut into whole batches, the batches shuffled (module docstring)."""
    chunks = []
    for bucket in np.unique(buckets):
        rows = np.flatnonzero(buckets == bucket)
        if rng is not None:
            rows = rows[rng.permutation(len(rows))]
        whole = len(rows) // batch * batch
        chunks.append(rows[:whole].reshape(-1, batch))
    out = np.concatenate(chunks)
    return out if rng is None else out[rng.permutation(len(out))]


def batches_per_epoch(buckets: np.ndarray, batch: int) -> int:
    """How many whole global batches one epoch holds."""
    return int(sum(count // batch for count in np.unique(buckets, return_counts=True)[1]))
