"""A tiny FLUX pipeline folder and captioned images, made locally: what the text-to-image tests train on
(recipes/make_flux_demo.py makes them, as the walk-through does)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "recipes"))

from make_flux_demo import IMAGE_SIZE, TEXT_LEN, TINY_FLUX, captioned_folder, pipeline_folder  # noqa: E402

__all__ = ["IMAGE_SIZE", "TEXT_LEN", "TINY_FLUX", "captioned_folder", "pipeline_folder"]
