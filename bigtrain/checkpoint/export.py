"""A checkpoint as a HuggingFace model folder, written by one CPU process holding one safetensors shard at a time.

The weights are read from the checkpoint's DCP files a shard's worth of parameters at a time (DCP assembles each
full tensor from the pieces every rank wrote), so neither the trainer's ranks nor this process ever gather the
whole model in memory. Parameters that the architecture ties to another one (the LM head of a tied-embedding
model) are stored once, as ``save_pretrained`` does. The weights are exported as trained, in fp32, and the config
says so, so ``from_pretrained`` reproduces the trained model's logits exactly.
"""

from __future__ import annotations

import copy
import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from bigtrain.checkpoint.layout import HF_FILES, Manifest, check_files, resolve_checkpoint, staged
from bigtrain.checkpoint.reader import MODEL_PREFIX, load_into, read_metadata
from bigtrain.errors import ConfigError
from bigtrain.models.build import set_cache
from bigtrain.models.checkpoint_keys import to_checkpoint_keys

MAX_SHARD_BYTES = 2 * 2**30  # per safetensors file, like HF's sharded checkpoints


@dataclass(frozen=True)
class HfFiles:
    """What a run's HF folder holds beside its config and weights, as its task says (``TaskSpec.export_files``):
    a tokenizer folder to save, or the built-in byte tokenizer the run read its text with; an image classifier's
    image processor settings (size, mean, std: the model folder's own processor is copied instead where it has
    one); a vision-language model's processor (its folder and the pixel budget trained with, data.min_pixels and
    data.max_pixels)."""

    tokenizer: str | None = None
    byte_tokenizer: bool = False
    image_processor: dict[str, Any] | None = None
    processor: tuple[str, int | None, int | None] | None = None
    # an embedding model's pooling (train.pooling), its width and the longest text it was trained on: the files
    # that make the folder a sentence-transformers model (``SentenceTransformer(folder)``)
    sentence_transformer: tuple[str, int, int] | None = None


def write_hf_files(folder: Path, hf_config: Any, model_folder: str | None, files: HfFiles) -> None:
    """Everything of an HF model folder except the weights: config (fp32, KV cache on again), the source model's
    generation config when it had one, and what the task keeps beside the weights (``files``)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(hf_config)
    set_cache(config, True)  # the trainer turned the KV cache off; generation wants it
    config.dtype = torch.float32
    config.save_pretrained(folder)
    if model_folder is not None and (Path(model_folder) / "generation_config.json").is_file():
        shutil.copy2(Path(model_folder) / "generation_config.json", folder / "generation_config.json")
    if files.tokenizer is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(files.tokenizer, local_files_only=True).save_pretrained(folder)
    elif files.byte_tokenizer:
        from bigtrain.data.tokenizer import save_byte_tokenizer

        save_byte_tokenizer(folder)
    if files.image_processor is not None:
        _write_image_processor(folder, model_folder, files.image_processor)
    if files.processor is not None:
        _write_processor(folder, *files.processor)
    if files.sentence_transformer is not None:
        from bigtrain.checkpoint.sentence_transformer import write_sentence_transformer

        write_sentence_transformer(folder, *files.sentence_transformer)


def _write_processor(folder: Path, source: str, min_pixels: int | None, max_pixels: int | None) -> None:
    """The processor as ``processor.save_pretrained`` writes it: its tokenizer, then its own files (the processor's
    chat template replaces a tokenizer's), the image processor rewritten where the run changed its pixel budget."""
    from transformers import AutoTokenizer

    from bigtrain.data.processor import PROCESSOR_FILES, load_processor

    AutoTokenizer.from_pretrained(source, local_files_only=True).save_pretrained(folder)
    for name in (*PROCESSOR_FILES, "video_preprocessor_config.json"):
        if (Path(source) / name).is_file():
            shutil.copy2(Path(source) / name, folder / name)
    if min_pixels is not None or max_pixels is not None:
        load_processor(source, "the processor", min_pixels, max_pixels).image_processor.save_pretrained(folder)


def _write_image_processor(folder: Path, model_folder: str | None, settings: dict[str, Any]) -> None:
    own = None if model_folder is None else Path(model_folder) / "preprocessor_config.json"
    if own is not None and own.is_file():
        shutil.copy2(own, folder / own.name)
        return
    # resize to a square, rescale to [0, 1], normalise: what was trained (the PIL backend: torchvision's needs a
    # torchvision that loads, see data/images.py)
    from transformers import ViTImageProcessorPil

    side = settings["size"]
    processor = ViTImageProcessorPil(
        size={"height": side, "width": side}, image_mean=list(settings["mean"]), image_std=list(settings["std"])
    )
    processor.save_pretrained(folder)


def meta_model_of(hf_config: Any) -> Any:
    """The architecture on meta: its ties and its checkpoint format are the model's own, not lists of ours."""
    from bigtrain.models.build import build_meta_model

    return build_meta_model(copy.deepcopy(hf_config), "eager")


def tied_aliases(hf_config: Any, model: Any = None) -> set[str]:
    """Parameter names that are another parameter under a second name in this architecture (e.g. ``lm_head.weight``
    with tied embeddings)."""
    model = model if model is not None else meta_model_of(hf_config)
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    return every - {name for name, _ in model.named_parameters()}


def export_model(checkpoint: str | Path, out: str | Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    """Write checkpoint ``checkpoint`` (a step_N folder, or a run's output_dir: its newest) as an HF folder ``out``
    (replaced atomically if it exists); returns the checkpoint folder used."""
    from bigtrain.models.build import read_saved_config

    folder = resolve_checkpoint(checkpoint)
    check_files(folder, Manifest.read(folder))
    hf_config = read_saved_config(folder / HF_FILES)
    tensors = _model_tensors(folder)
    meta = meta_model_of(hf_config)
    aliases = tied_aliases(hf_config, meta)
    names = [name for name in tensors if name not in aliases]
    shards = _shards(names, tensors, max_shard_bytes)

    with staged(Path(out)) as partial:  # a failed export (a full disk) leaves nothing half-written
        _write_folder(folder, partial, names, tensors, shards, meta, getattr(hf_config, "weights_stem", "model"))
    return folder


def _write_folder(
    folder: Path,
    partial: Path,
    names: list[str],
    tensors: dict[str, TensorStorageMetadata],
    shards: list[list[str]],
    meta: Any,
    stem: str,
) -> None:
    """The HF folder in ``partial``: the checkpoint's hf/ files and the weights, one safetensors shard at a time,
    under the family's own checkpoint keys (``to_checkpoint_keys``: e.g. Mixtral's per-expert tensors), in files
    named as the model's library reads them (``stem``: transformers' ``model``, diffusers'
    ``diffusion_pytorch_model``)."""
    from safetensors.torch import save_file

    shutil.copytree(folder / HF_FILES, partial)
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        file = f"{stem}.safetensors" if len(shards) == 1 else f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        state = {MODEL_PREFIX + n: torch.empty(tensors[n].size, dtype=tensors[n].properties.dtype) for n in shard}
        with warnings.catch_warnings():  # DCP warns that it reads in one process: that is the point here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            load_into(state, folder, no_dist=True)
        on_disk = to_checkpoint_keys(meta, {n: state[MODEL_PREFIX + n] for n in shard})
        on_disk = {key: value.contiguous() for key, value in on_disk.items()}
        save_file(on_disk, str(partial / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(on_disk, file))
        del state
    if len(shards) > 1:
        total = sum(_nbytes(tensors[n]) for n in names)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (partial / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _model_tensors(folder: Path) -> dict[str, TensorStorageMetadata]:
    """The model's tensors in a checkpoint, by HF name, with their global shape and dtype."""
    metadata = read_metadata(folder)
    tensors = {
        key.removeprefix(MODEL_PREFIX): md
        for key, md in metadata.state_dict_metadata.items()
        if key.startswith(MODEL_PREFIX) and isinstance(md, TensorStorageMetadata)
    }
    if not tensors:
        raise ConfigError(f"checkpoint {folder} holds no model weights")
    return tensors


def _nbytes(md: TensorStorageMetadata) -> int:
    return md.size.numel() * md.properties.dtype.itemsize


def _shards(names: list[str], tensors: dict[str, TensorStorageMetadata], max_bytes: int) -> list[list[str]]:
    """Consecutive names grouped into files of at most ``max_bytes`` (a larger single tensor gets its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name in names:
        n = _nbytes(tensors[name])
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards
