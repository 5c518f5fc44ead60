"""Give a sharded meta model real values: from a safetensors checkpoint, or from the model's own HF initialisation.

Every value is produced as the *full* tensor of one parameter (or one module) at a time on the host, then each rank
keeps only its own shard (``distribute_tensor(..., src_data_rank=None)`` splits locally: every rank read the same
bytes, so no communication is needed). Peak host memory is one module, not one model.

From-scratch values come from walking an unsharded meta twin of the model in a fixed order under ``train.seed`` and
calling HF's ``_init_weights`` on one module at a time, so the initial weights are the same for every plan.
Non-persistent buffers (rotary ``inv_freq``) are never in checkpoints; the same walk recomputes them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from bigtrain.errors import ConfigError
from bigtrain.models.checkpoint_keys import ConvertedCheckpoint
from bigtrain.models.safetensors_reader import SafetensorsReader


def _tied_groups(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Places that share one Parameter object (e.g. tied embeddings and LM head)."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            places.setdefault(id(param), []).append((module, name))
    return [group for group in places.values() if len(group) > 1]


def _retie(groups: list[list[tuple[nn.Module, str]]]) -> None:
    # Module.to_empty replaces each module's parameters one by one, which turns one shared Parameter into two.
    for (first_module, first_name), *rest in groups:
        shared = getattr(first_module, first_name)
        for module, name in rest:
            setattr(module, name, shared)


def to_empty_keeping_ties(model: nn.Module, device: torch.device, param_device: torch.device | None = None) -> None:
    """Allocate every parameter and buffer on ``device`` (values undefined); shared parameters stay shared.

    ``param_device`` puts the parameters elsewhere (the host, for FSDP2's CPU offload, which keeps sharded parameters
    there and moves them in per module), while buffers (rotary ``inv_freq``) stay where the compute runs.
    """
    tied = _tied_groups(model)
    model.to_empty(device=param_device or device)
    _retie(tied)
    if param_device is not None and param_device != device:
        for module in model.modules():
            for name, buffer in module.named_buffers(recurse=False):
                module._buffers[name] = torch.empty_like(buffer, device=device)


def _targets(models: list[nn.Module], hf_name: Callable[[str], str]) -> dict[str, list[torch.Tensor]]:
    """Every parameter and buffer by HF name; a name may have several places (the rotary buffers of each pipeline
    stage one rank runs)."""
    out: dict[str, list[torch.Tensor]] = {}
    for model in models:
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            out.setdefault(hf_name(name), []).append(tensor)
    return out


# How a full value becomes a target's own kind of tensor before its shard is taken (QLoRA: the NF4 quantisation of
# the whole weight, so that every shard shares the whole tensor's statistics); it returns None for a target it does
# not concern (a plain copy).
Convert = Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None


def _shard_of(whole: torch.Tensor, target: DTensor) -> torch.Tensor:
    """This rank's rows of ``whole`` as ``target`` places them (sharded along dim 0 over its mesh, evenly)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(whole.shape, target.device_mesh, target.placements)
    if shape[0] == whole.shape[0]:
        return whole
    return torch.chunk(whole, whole.shape[0] // shape[0])[offset[0] // shape[0]]


@torch.no_grad()
def copy_full_into(target: torch.Tensor, full: torch.Tensor, name: str, source: str, convert: Convert = None) -> None:
    """Write the full value ``full`` into ``target``, keeping only this rank's shard if ``target`` is a DTensor;
    ``name`` and ``source`` (the file it came from) only name them in an error; ``convert`` (see ``Convert``)."""
    if tuple(full.shape) != tuple(target.shape):
        raise ConfigError(
            f"{name} in {source} has shape {tuple(full.shape)} but the model's config makes it "
            f"{tuple(target.shape)}: the weights and config.json do not belong together"
        )
    local_target = target.to_local() if isinstance(target, DTensor) else target
    whole = convert(local_target, full) if convert is not None else None
    if whole is not None:
        local_target.copy_(_shard_of(whole, target) if isinstance(target, DTensor) else whole)
    elif isinstance(target, DTensor):
        local = full.to(device=target.device, dtype=target.dtype)
        target.copy_(distribute_tensor(local, target.device_mesh, target.placements, src_data_rank=None))
    else:
        target.copy_(full.to(device=target.device, dtype=target.dtype))


def write_full(target: torch.Tensor, full: torch.Tensor, name: str, source: str, convert: Convert = None) -> None:
    """``copy_full_into``, also for a DeepSpeed ZeRO-3 partition: gathered, written (the same value on every rank),
    split again, so no rank holds more than this one parameter whole."""
    if hasattr(target, "ds_id"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([target], modifier_rank=0):
            copy_full_into(target, full, name, source)
    else:
        copy_full_into(target, full, name, source, convert)


@torch.no_grad()
def materialize(
    models: list[nn.Module],
    meta_twin: Any,
    checkpoint: str | None,
    seed: int,
    hf_name: Callable[[str], str] = str,
    convert: Convert = None,
    new_head: bool = False,
) -> None:
    """Fill every parameter and buffer of ``models``, already sharded and allocated (``to_empty_keeping_ties``, or
    DeepSpeed's partitioned construction).

    ``models`` is ``[model]``, or the pipeline stages one rank runs (each holding part of it under the HF names);
    ``meta_twin`` is an unsharded meta copy of the whole HF model; ``checkpoint`` is a HF folder or None (init);
    ``hf_name``: the HF name of a parameter of ``models`` (wrappers may have changed it); ``convert``: see
    ``Convert``; ``new_head``: a classifier trained on another number of labels than the checkpoint's (its head's
    values are not loaded but initialised, as transformers' ``ignore_mismatched_sizes`` does).
    """
    targets = _targets(models, hf_name)
    for fqn, value, source in full_values(meta_twin, targets.keys(), checkpoint, seed, new_head):
        for target in targets[fqn]:
            write_full(target, value, fqn, source, convert)


def _initialisers(model: nn.Module) -> dict[str, Any]:
    """Each module's nearest enclosing transformers model (itself included), whose ``_init_weights`` initialises it
    as transformers does: a vision-language model's vision tower (CLIP's, SigLIP's) is a model of its own, with its
    own rules (e.g. CLIP's position ids, which the outer model's rules leave unset)."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):  # a diffusers model: each module as its own constructor makes it
        own = OwnReset()
        return {name: own for name, _ in model.named_modules()}
    owners: dict[str, Any] = {}
    for name, module in model.named_modules():
        if isinstance(module, PreTrainedModel):
            owners[name] = module
        else:
            owners[name] = owners[name.rsplit(".", 1)[0] if "." in name else ""]
    return owners


class OwnReset:
    """The initialisation of a model that is not a transformers one (a diffusers transformer, whose constructors
    initialise every module by torch's rules): each module's own ``reset_parameters``."""

    def _init_weights(self, module: nn.Module) -> None:
        reset = getattr(module, "reset_parameters", None)
        if reset is None:
            raise ConfigError(
                f"{type(module).__name__} has no initialisation of its own (reset_parameters); train from a saved "
                "model (model.name_or_path) instead of model.config"
            )
        reset()


def _reader(checkpoint: str, meta_twin: Any) -> Any:
    """The checkpoint's values by the model's names: transformers' folder converted to the model's names, or a
    diffusers folder's transformer weights as they are."""
    from transformers import PreTrainedModel

    if isinstance(meta_twin, PreTrainedModel):
        return ConvertedCheckpoint(checkpoint, meta_twin)
    from bigtrain.config.diffusers_config import WEIGHTS_STEM, weights_folder

    return SafetensorsReader(weights_folder(Path(checkpoint)), WEIGHTS_STEM)


@torch.no_grad()
def full_values(
    meta_twin: Any, wanted: Collection[str], checkpoint: str | None, seed: int, new_head: bool = False
) -> Iterator[tuple[str, torch.Tensor, str]]:
    """(name, full value, where it came from) of every parameter and buffer named in ``wanted`` (HF names), one
    module at a time: read from ``checkpoint`` (a HF folder), or HF's own initialisation under ``seed`` when there is
    none. Each value is valid until the next one is asked for; the whole model is walked in a fixed order, so every
    plan gets the same values. ``new_head``: a checkpoint value of another shape than the model's is initialised
    instead (the head of a classifier given another number of labels), and so is one the checkpoint lacks outside
    the base model (a reward model's head on a causal LM's folder), each such name logged once.
    """
    reader = _reader(checkpoint, meta_twin) if checkpoint else None
    loaded, missing, replaced = 0, [], []
    base = getattr(meta_twin, "base_model_prefix", "")
    in_base = lambda fqn: bool(base) and fqn.startswith(f"{base}.")  # noqa: E731
    torch.manual_seed(seed)
    owners = _initialisers(meta_twin)
    for mod_name, mod in meta_twin.named_modules():
        names = [n for n, _ in mod.named_parameters(recurse=False)] + [n for n, _ in mod.named_buffers(recurse=False)]
        fqns = {n: f"{mod_name}.{n}" if mod_name else n for n in names}
        wanted_here = {n: f for n, f in fqns.items() if f in wanted}
        if not names or (not wanted_here and reader is not None):
            continue
        from_ckpt = {n: reader.get(f) for n, f in wanted_here.items()} if reader else {}
        if new_head:
            # the head's values: of another shape, or absent (a causal LM's folder made a reward model: its head lies
            # outside the base model, as transformers' task classes place it)
            shaped = {
                n: v
                for n, v in from_ckpt.items()
                if (v is not None and v.shape != getattr(mod, n).shape) or (v is None and not in_base(fqns[n]))
            }
            for n in shaped:
                from_ckpt[n] = None
                replaced.append(fqns[n])
        if any(v is None for v in from_ckpt.values()) or not from_ckpt:
            # Let HF initialise this one module on the host, exactly as it would the whole model; also the modules
            # another pipeline stage holds, so that the random stream (and every value) is the same for every plan.
            mod.to_empty(device="cpu", recurse=False)
            owners[mod_name]._init_weights(mod)
        is_param = {n for n, _ in mod.named_parameters(recurse=False)}
        for n, fqn in wanted_here.items():
            value = from_ckpt.get(n)
            source = "HF's initialisation"
            if value is None:
                if reader is not None and n in is_param and fqn not in replaced:
                    missing.append(fqn)
                value = getattr(mod, n)
            else:
                loaded += 1
                source = reader.file_of(fqn)  # a value came from the checkpoint, so there is a reader
            yield fqn, value, source
        mod.to_empty(device="meta", recurse=False)
    if reader is not None and (missing or loaded == 0):
        example = ", ".join(missing[:3])
        raise ConfigError(
            f"model.name_or_path={checkpoint!r} lacks {len(missing)} of the model's parameters (e.g. {example}); "
            "it must be a save_pretrained folder of the same architecture"
        )
