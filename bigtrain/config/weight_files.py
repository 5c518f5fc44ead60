"""What a safetensors weight file holds, read from its header by the safetensors library: no tensor is loaded, and
no torch is imported (the planner reads these before any model is built)."""

from __future__ import annotations

from pathlib import Path


def tensor_entries(file: Path) -> list[tuple[list[int], str]]:
    """Each tensor's (shape, safetensors dtype name: "BF16", "F32", ...) in ``file``."""
    from safetensors import safe_open

    with safe_open(str(file), framework="numpy") as f:
        slices = [f.get_slice(key) for key in f.keys()]  # noqa: SIM118 - safe_open is not a mapping
        return [(piece.get_shape(), piece.get_dtype()) for piece in slices]
