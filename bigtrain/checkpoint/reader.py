"""Reading DCP files with errors that name the file: DCP's own reader reports a damaged shard as a bare unpickling
or EOF error, which says nothing about where to look."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future

from bigtrain.checkpoint.layout import DCP_METADATA
from bigtrain.errors import ConfigError

MODEL_PREFIX = "model."  # the engine state's model section, as DCP flattens it


class DamagedFile(RuntimeError):
    """A DCP file of a checkpoint that cannot be read."""


class NamingReader(FileSystemReader):
    """``FileSystemReader`` reading one file at a time, so that a failure says which file it was."""

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in per_file.items():
            try:
                super().read_data(dataclasses.replace(plan, items=items), planner).wait()
            except Exception as e:
                raise DamagedFile(f"{Path(self.path) / name} cannot be read ({type(e).__name__}: {e})") from e
        done: Future[None] = Future()
        done.set_result(None)
        return done


def read_metadata(folder: Path) -> Metadata:
    try:
        return FileSystemReader(str(folder)).read_metadata()
    except Exception as e:  # noqa: BLE001 - any unreadable .metadata is the same user-facing problem
        raise ConfigError(f"checkpoint {folder} is damaged: {folder / DCP_METADATA} cannot be read ({e})") from e


def load_into(state: dict[str, Any], folder: Path, no_dist: bool = False) -> None:
    """``dcp.load`` of ``state`` from ``folder``; a file that cannot be read is a ConfigError naming it. In a job,
    DCP gathers every rank's read result first, so every rank raises the same error (no rank is left waiting)."""
    try:
        dcp.load(state, storage_reader=NamingReader(str(folder)), no_dist=no_dist)
    except CheckpointException as e:
        rank = min(e.failures)
        error, _ = e.failures[rank]
        text = str(error) if isinstance(error, DamagedFile) else f"{type(error).__name__}: {error}"
        raise ConfigError(f"checkpoint {folder} is damaged: {text} (read by rank {rank})") from None
