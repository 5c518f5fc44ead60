"""A vision-language model's micro-batch for the simulator, and the dispatch mode that lets its step run on fake
tensors.

transformers' vision-language forwards read values, not only shapes: they count the image tokens of ``input_ids``
(``.item()``), lay out Qwen-VL's windows and rotary positions from ``image_grid_thw`` (``.tolist()``), and select the
image positions with boolean masks (``nonzero``). On fake tensors none of those values exist. They are all functions
of the batch's token ids and image grids, which are small and known, so ``RealValuedInputs`` keeps them real: an op
whose tensor inputs are all real runs for real (outside the fake mode), an integer tensor a factory makes (``arange``,
``full``) is made for real, and a real boolean mask indexing a fake tensor is replaced by the positions it selects.
Everything the weights touch stays fake (no memory, no arithmetic), and what is real is small: token ids, positions,
window indices. The model's forward runs unchanged.

The batch is what the family's processor makes of rows holding ``images_per_row`` square images of ``image_size``
pixels (``planner/vision_stats.py``'s geometry: Qwen-VL's resized grid, Idefics3's tiles, a fixed tower's size) with
the family's image tokens, the rest of each row text, the last quarter the labelled answer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.data.batch import ImageChatBatch
from bigtrain.data.labels import IGNORE_INDEX, next_token_labels
from bigtrain.errors import ConfigError
from bigtrain.planner.vision_stats import VisionStats, image_size_of, vision_stats

REAL_FACTORY_LIMIT = 1 << 22  # elements: an integer tensor a factory makes is real up to this size (indices, not data)
TEXT_ID = 100  # an ordinary token of every family's vocabulary (what the text of a row is does not change its cost)
_INDEXING = (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default)


class RealValuedInputs(TorchDispatchMode):
    """Keeps what derives from the batch's real token ids and image grids real under a FakeTensorMode (entered
    after it, so that it sees each op first)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if tensors and not any(isinstance(t, FakeTensor) for t in tensors):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func in _INDEXING:
            args = (args[0], _positions(args[1]), *args[2:])
        out = func(*args, **kwargs)
        if not tensors and _small_index(out):  # made for real: its values may be read (.tolist(), .item())
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        return out


def _small_index(out: Any) -> bool:
    return isinstance(out, FakeTensor) and not out.is_floating_point() and out.numel() <= REAL_FACTORY_LIMIT


def _positions(indices: list[Any]) -> list[Any]:
    """Indices with each real boolean mask replaced by the positions it selects (a fake op cannot count them)."""
    out: list[Any] = []
    for index in indices:
        if isinstance(index, torch.Tensor) and not isinstance(index, FakeTensor) and index.dtype == torch.bool:
            with unset_fake_temporarily():
                out.extend(index.nonzero(as_tuple=True))
        else:
            out.append(index)
    return out


def image_chat_batch(hf_config: Any, plan: Plan, workload: Workload, device: torch.device) -> ImageChatBatch:
    """Rank 0's micro-batch: ``plan.micro_batch_size`` rows of ``workload.seq_len`` tokens, each with
    ``workload.images_per_row`` images of ``image_size_of(workload)`` pixels per side."""
    images = workload.images_per_row
    if images != int(images) or images < 1:
        raise ConfigError(f"images_per_row={images:g}: a simulated row holds a whole number of images (1 or more)")
    vision, side = vision_stats(hf_config), image_size_of(workload)
    family = _FAMILIES.get(hf_config.model_type)
    if family is None:
        raise ConfigError(
            f"--simulate knows the inputs of {', '.join(sorted(_FAMILIES))}; {hf_config.model_type!r} is not among them"
        )
    block, extra = family(hf_config, vision, side, int(images))
    rows, length = plan.micro_batch_size, workload.seq_len
    if len(block) * int(images) > length * 3 // 4:
        raise ConfigError(
            f"{int(images)} image(s) of {side} px are {len(block) * int(images)} tokens: more than the row's "
            f"{length} leave room for text"
        )
    row = [TEXT_ID] * 8 + block * int(images)
    row += [TEXT_ID] * (length - len(row))
    ids = torch.tensor([row] * rows, dtype=torch.long)
    labels = next_token_labels(ids)
    labels[:, : length - length // 4] = IGNORE_INDEX  # the answer: the row's last quarter
    inputs = {"attention_mask": torch.ones_like(ids)}
    for name, make in extra.items():
        inputs[name] = make(rows, ids)
    return ImageChatBatch(ids.to(device), labels.to(device), {k: v.to(device) for k, v in inputs.items()})


def _qwen_vl(hf_config: Any, vision: VisionStats, side: int, images: int) -> tuple[list[int], dict[str, Any]]:
    """Qwen2-VL / Qwen2.5-VL: the image resized to a multiple of patch x merge pixels, flattened into patches of
    3 x temporal x patch² values, ``image_grid_thw`` = (1, side/patch, side/patch)."""
    grid = round(vision.patches(side) ** 0.5)
    pad = [hf_config.image_token_id] * vision.tokens(side)
    block = [hf_config.vision_start_token_id, *pad, hf_config.vision_end_token_id]
    values = 3 * hf_config.vision_config.temporal_patch_size * vision.patch**2
    return block, {
        "pixel_values": lambda rows, ids: torch.empty(rows * images * grid * grid, values),
        "image_grid_thw": lambda rows, ids: torch.tensor([[1, grid, grid]] * rows * images),
    }


def _gemma3(hf_config: Any, vision: VisionStats, side: int, images: int) -> tuple[list[int], dict[str, Any]]:
    """Gemma 3: every image resized to the tower's size, its tokens between begin- and end-of-image tokens, and
    ``token_type_ids`` marking them (its image tokens attend to each other both ways)."""
    block = [hf_config.boi_token_index, *[hf_config.image_token_index] * vision.tokens(side), hf_config.eoi_token_index]
    size = vision.tower_size
    return block, {
        "pixel_values": lambda rows, ids: torch.empty(rows * images, 3, size, size),
        "token_type_ids": lambda rows, ids: (ids == hf_config.image_token_index).long(),
    }


def _llava(hf_config: Any, vision: VisionStats, side: int, images: int) -> tuple[list[int], dict[str, Any]]:
    """LLaVA: every image resized to the tower's size, one token per patch feature the projector gets."""
    size = vision.tower_size
    return [hf_config.image_token_index] * vision.tokens(side), {
        "pixel_values": lambda rows, ids: torch.empty(rows * images, 3, size, size)
    }


def _idefics3(hf_config: Any, vision: VisionStats, side: int, images: int) -> tuple[list[int], dict[str, Any]]:
    """Idefics3 / SmolVLM: tiles of the tower's size (plus the whole image when split), each tile's tokens; the
    tiles of a row's images stacked per row with their pixel masks."""
    size = vision.tower_size
    tiles = vision.patches(side) // (size // vision.patch) ** 2
    per_tile = (size // vision.patch) ** 2 // vision.merge**2
    return [hf_config.image_token_id] * (tiles * per_tile), {
        "pixel_values": lambda rows, ids: torch.empty(rows, images * tiles, 3, size, size),
        "pixel_attention_mask": lambda rows, ids: torch.ones(rows, images * tiles, size, size, dtype=torch.bool),
    }


_FAMILIES = {
    "qwen2_vl": _qwen_vl,
    "qwen2_5_vl": _qwen_vl,
    "gemma3": _gemma3,
    "llava": _llava,
    "idefics3": _idefics3,
    "smolvlm": _idefics3,
}
