"""A decoded picture as 8-bit RGB, whatever its depth: PIL's ``convert("RGB")`` clips a 16-bit grayscale image
(modes ``I;16*``, and ``I`` as PNG's 16-bit grayscale opens) at 255 instead of scaling it, so a full-range ramp would
reach the model 99% white; such pictures are scaled to 0..255 first."""

from __future__ import annotations

from typing import Any

import numpy as np

WIDE_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # integer pixels of up to 16 bits


def rgb(image: Any) -> Any:
    """``image`` (a PIL image) in mode RGB, a 16-bit one scaled (65535 -> 255), a float one (mode F) read as 0..1."""
    from PIL import Image

    if image.mode in WIDE_MODES:
        wide = np.asarray(image, dtype=np.float64)
        image = Image.fromarray(np.clip(np.rint(wide / 257.0), 0, 255).astype(np.uint8))
    elif image.mode == "F":
        image = Image.fromarray(np.clip(np.rint(np.asarray(image) * 255.0), 0, 255).astype(np.uint8))
    return image.convert("RGB")


def rgb_array(image: Any) -> np.ndarray:
    """``rgb(image)`` as a writable ``[height, width, 3]`` uint8 array (a read-only one would make torch warn when it
    wraps it)."""
    return np.array(rgb(image))
