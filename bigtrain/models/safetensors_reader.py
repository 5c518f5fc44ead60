"""Lazy access to the tensors of a HF model folder (one safetensors file, or shards with an index), by their keys on
disk; damaged or incomplete folders are one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bigtrain.errors import ConfigError


class SafetensorsReader:
    """Lazy access to the tensors of a HF model folder (single file or sharded with an index)."""

    def __init__(self, folder: str | Path, stem: str = "model") -> None:
        """``stem``: the weights' file name (transformers' ``model``, diffusers' ``diffusion_pytorch_model``)."""
        from safetensors import safe_open

        folder = Path(folder)
        index = folder / f"{stem}.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        elif (folder / f"{stem}.safetensors").is_file():
            files = [f"{stem}.safetensors"]
            weight_map = None
        else:
            raise ConfigError(
                f"model.name_or_path={str(folder)!r} has no {stem}.safetensors (or index); "
                "re-save it with save_pretrained(..., safe_serialization=True)"
            )
        self._folder = folder
        self._handles = {}
        for name in files:
            try:
                self._handles[name] = safe_open(str(folder / name), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own SafetensorError, OSError, or a Rust panic's error
                raise ConfigError(
                    f"model.name_or_path={str(folder)!r}: {name} is damaged or truncated ({e}); copy or save the "
                    "model again"
                ) from e
        self._where: dict[str, str] = {}
        for name, handle in self._handles.items():
            for key in handle.keys():
                self._where[key] = name
        if weight_map is not None:
            self._where.update(weight_map)

    def keys(self) -> set[str]:
        return set(self._where)

    def get(self, key: str) -> torch.Tensor | None:
        name = self._where.get(key)
        if name is None:
            return None
        if name not in self._handles:
            raise ConfigError(
                f"model.name_or_path={str(self._folder)!r}: the index maps {key} to {name}, which is not in the "
                "folder; copy the whole model folder"
            )
        try:
            return self._handles[name].get_tensor(key)
        except Exception as e:
            raise ConfigError(
                f"model.name_or_path={str(self._folder)!r}: {key} in {name} cannot be read ({e}); the file is "
                "damaged or truncated: copy or save the model again"
            ) from e

    def file_of(self, key: str) -> str:
        return str(self._folder / self._where.get(key, "?"))
