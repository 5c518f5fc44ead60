"""The built-in image set (``data.path: builtin:shapes``): ten classes of procedurally drawn pictures, no download.

Each image is a shape (disk, square, triangle, ring, cross, plus, or a texture: horizontal, vertical or diagonal
stripes, a checkerboard) in a random colour on a random background, at a random place and scale, with pixel noise.
The class is what is drawn, never the colour or the place, so a model must look at the shape: a small CNN learns it
in a few hundred steps, and a wrong plan (a missing gradient, unsynchronised statistics) shows in the loss. 2,000
images of 32 x 32 pixels (6 MB) are drawn in well under a second, the same for a given seed on every rank.
"""

from __future__ import annotations

import numpy as np

CLASSES = (
    "disk",
    "square",
    "triangle",
    "ring",
    "cross",
    "horizontal_stripes",
    "vertical_stripes",
    "diagonal_stripes",
    "checkerboard",
    "plus",
)
SIDE = 32
COUNT = 2000


def _mask(kind: str, side: int, rng: np.random.Generator) -> np.ndarray:
    """Where the shape of class ``kind`` is, as a [side, side] bool mask."""
    y, x = np.mgrid[0:side, 0:side].astype(np.float32)
    cy, cx = rng.uniform(0.35, 0.65, size=2) * side
    r = rng.uniform(0.18, 0.32) * side
    dy, dx = y - cy, x - cx
    period = rng.uniform(4, 7)
    if kind == "disk":
        return dy**2 + dx**2 <= r**2
    if kind == "square":
        return (np.abs(dy) <= r * 0.85) & (np.abs(dx) <= r * 0.85)
    if kind == "triangle":
        return (dy <= r * 0.8) & (dy >= -r) & (np.abs(dx) <= (dy + r) * 0.6)
    if kind == "ring":
        d = np.sqrt(dy**2 + dx**2)
        return (d <= r) & (d >= r * 0.6)
    if kind == "cross":
        return ((np.abs(dy - dx) <= r * 0.25) | (np.abs(dy + dx) <= r * 0.25)) & (np.maximum(abs(dy), abs(dx)) <= r)
    if kind == "plus":
        return ((np.abs(dy) <= r * 0.25) | (np.abs(dx) <= r * 0.25)) & (np.maximum(abs(dy), abs(dx)) <= r)
    if kind == "horizontal_stripes":
        return (y // (period / 2)) % 2 == 0
    if kind == "vertical_stripes":
        return (x // (period / 2)) % 2 == 0
    if kind == "diagonal_stripes":
        return ((x + y) // (period / 2)) % 2 == 0
    return ((x // period) + (y // period)) % 2 == 0  # checkerboard


def shapes(count: int = COUNT, side: int = SIDE, seed: int = 1234) -> tuple[np.ndarray, np.ndarray]:
    """``count`` images [count, side, side, 3] uint8 and their labels [count] (indices into ``CLASSES``), each class
    equally often, in a seeded order."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % len(CLASSES)
    rng.shuffle(labels)
    images = np.empty((count, side, side, 3), dtype=np.uint8)
    for i, label in enumerate(labels):
        mask = _mask(CLASSES[label], side, rng)[..., None]
        background, colour = rng.uniform(0, 255, size=(2, 3))
        if np.abs(background - colour).sum() < 150:  # a shape the colour of its background is no example
            colour = 255 - background
        picture = np.where(mask, colour, background) + rng.normal(0, 12, size=(side, side, 3))
        images[i] = np.clip(picture, 0, 255).astype(np.uint8)
    return images, labels.astype(np.int64)
