"""Resuming: a checkpoint read into a freshly built engine, whatever plan and world size saved it.

Everything that can be wrong with the checkpoint is checked from its files before any collective, identically on
every rank (all ranks read the same manifest and DCP metadata), so a bad checkpoint fails everywhere with the same
line: a missing or truncated shard by the sizes the manifest recorded, another model by parameter names and
shapes. A shard damaged in place was caught by the start that chose the checkpoint (``run_dir.plan_start`` checks
every file's checksum); what only shows while reading (a checkpoint without checksums) comes back from DCP on every
rank, because DCP gathers the read results of all ranks before returning.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bigtrain.checkpoint.layout import Manifest, check_files
from bigtrain.checkpoint.reader import MODEL_PREFIX, load_into, read_metadata
from bigtrain.checkpoint.state import STREAM, TRAINER, rng_key, rng_state, set_rng_state, step_source_key
from bigtrain.engine.base import REPLICA_STATE, Engine
from bigtrain.errors import ConfigError


@dataclass(frozen=True)
class Resumed:
    folder: Path
    manifest: Manifest
    rng_restored: bool
    stream: str | None = None  # a stream's position (data.streaming), when the checkpoint holds one
    # what this rank's step source kept (grpo's generation in progress), when saved by as many ranks
    step_source: str | None = None


def load_checkpoint(
    engine: Engine, folder: Path, device: torch.device, model_shapes: dict[str, tuple[int, ...]]
) -> Resumed:
    """Restore model, optimizer, schedule, loss scaler and (same world size only) RNG from ``folder``.

    ``model_shapes``: every parameter of the recipe's whole model by name (a pipeline rank holds only its stages').
    """
    manifest = Manifest.read(folder)
    # sizes only: the start that chose this folder (checkpoint/run_dir.plan_start) read it whole against its checksums
    check_files(folder, manifest, contents=False)
    metadata = read_metadata(folder)
    check_same_model(model_shapes, metadata.state_dict_metadata, folder)
    state = engine.state_to_load(metadata.state_dict_metadata.keys())
    rank = dist.get_rank()
    key = rng_key(rank)
    same_world = manifest.world_size == dist.get_world_size()
    restore_rng = same_world and f"{TRAINER}.{key}.cpu" in metadata.state_dict_metadata
    state[TRAINER] = {"step": -1, "tokens": -1, **({key: rng_state(device)} if restore_rng else {})}
    if f"{TRAINER}.{STREAM}" in metadata.state_dict_metadata:
        state[TRAINER][STREAM] = ""
    source = step_source_key(rank)
    if same_world and f"{TRAINER}.{source}" in metadata.state_dict_metadata:
        state[TRAINER][source] = ""
    # every-step training resuming replica groups' checkpoint: its optimizer state is group 0's
    saved = metadata.state_dict_metadata
    from_groups = "optimizer" in state and not any(k.startswith("optimizer.") for k in saved)
    from_groups = from_groups and any(k.startswith(f"{REPLICA_STATE}.r0.optimizer.") for k in saved)
    if from_groups:
        state[REPLICA_STATE] = {"r0": {"optimizer": state.pop("optimizer")}}
    load_into(state, folder)
    if from_groups:
        state["optimizer"] = state.pop(REPLICA_STATE)["r0"]["optimizer"]
    if state[TRAINER]["step"] != manifest.step:
        held = state[TRAINER]["step"]
        raise ConfigError(f"checkpoint {folder} is damaged: it holds step {held}, its manifest says {manifest.step}")
    engine.load_state_dict(state)
    if restore_rng:
        set_rng_state(state[TRAINER][key], device)
    return Resumed(folder, manifest, restore_rng, state[TRAINER].get(STREAM), state[TRAINER].get(source))


def check_same_model(ours: dict[str, tuple[int, ...]], saved: dict[str, Any], folder: Path) -> None:
    """The checkpoint holds exactly this model's parameters, by name and global shape."""
    theirs = {k.removeprefix(MODEL_PREFIX): tuple(md.size) for k, md in saved.items() if k.startswith(MODEL_PREFIX)}
    problems = [f"{k} is missing" for k in sorted(set(ours) - set(theirs))]
    problems += [f"{k} is not in this model" for k in sorted(set(theirs) - set(ours))]
    problems += [f"{k} has shape {list(theirs[k])}, not {list(s)}" for k, s in ours.items() if theirs.get(k, s) != s]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ConfigError(f"checkpoint {folder} holds another model than the recipe's: {'; '.join(problems[:3])}{more}")
