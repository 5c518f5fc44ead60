"""A HF checkpoint's keys as the model's parameter names, through transformers' own renaming and weight conversion.

transformers 5 does not always keep a checkpoint's keys: ``from_pretrained`` renames some (GPT-NeoX's ``embed_out``
is the model's ``lm_head``; Mixtral's ``block_sparse_moe`` is ``mlp``) and converts others (the per-expert
``experts.{i}.w1/w3/w2`` tensors of Mixtral, Qwen-MoE and DeepSeek checkpoints become one fused ``gate_up_proj`` and
one ``down_proj`` per layer). The rules live in transformers (``conversion_mapping.get_model_conversion_mapping``,
per family); :class:`ConvertedCheckpoint` applies them to one parameter at a time, so the loader still holds one
module's values and never the whole model. ``to_checkpoint_keys`` is the way back (``revert_weight_conversion``), so
an export is the family's own on-disk format.

Every conversion of the shipped families is local to one layer: a fused target's sources are that layer's keys
(all of its experts are read, stacked in expert order). A conversion with several targets (a split) converts once
and keeps the other targets until they are asked for.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import (
    WeightConverter,
    WeightRenaming,
    dot_natural_key,
    rename_source_key,
    revert_weight_conversion,
)

from bigtrain.models.safetensors_reader import SafetensorsReader


class ConvertedCheckpoint:
    """The values of a HF folder under the model's parameter names (``meta_model``: the HF model on meta)."""

    def __init__(self, folder: str | Path, meta_model: Any) -> None:
        self._reader = SafetensorsReader(folder)
        self._model = meta_model
        mapping = get_model_conversion_mapping(meta_model)
        renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in mapping if isinstance(m, WeightConverter)]
        self._converter_of = {pattern: c for c in converters for pattern in c.source_patterns}
        names = meta_model.state_dict()
        # target name -> its (checkpoint key, converter pattern or None), keys in natural order (expert 2 before 10)
        self._sources: dict[str, list[tuple[str, str | None]]] = {}
        for key in sorted(self._reader.keys(), key=dot_natural_key):
            target, pattern = rename_source_key(key, renamings, converters, meta_model.base_model_prefix, names)
            self._sources.setdefault(target, []).append((key, pattern))
        self._converted: dict[str, torch.Tensor] = {}  # other targets of a conversion, until asked for

    def keys(self) -> set[str]:
        return set(self._sources) | set(self._converted)

    def get(self, name: str) -> torch.Tensor | None:
        """The full value of parameter or buffer ``name``, or None when the checkpoint has none."""
        if name in self._converted:
            return self._converted.pop(name)
        sources = self._sources.get(name)
        if not sources:
            return None
        key, pattern = sources[0]
        if pattern is None:
            return self._reader.get(key)
        converter = copy.deepcopy(self._converter_of[pattern])  # as transformers' loader: one per target
        for key, pattern in sources:
            converter.add_tensor(name, key, pattern, self._reader.get(key))
        out = converter.convert(name, model=self._model, config=self._model.config)
        values = {target: v[0] if isinstance(v, list) else v for target, v in out.items()}
        value = values.pop(name)
        self._converted.update(values)
        return value

    def file_of(self, name: str) -> str:
        sources = self._sources.get(name)
        return self._reader.file_of(sources[0][0]) if sources else self._reader.file_of(name)


def to_checkpoint_keys(model: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (the model's parameter names) under the keys and layout the family's checkpoints use: what
    ``save_pretrained`` writes (transformers' own reversal of its load-time conversions); ``state`` may be part of
    the model (one module's tensors)."""
    return revert_weight_conversion(model, state)
