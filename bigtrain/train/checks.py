"""Start-up checks of a training job that need the model or the data (the recipe alone is checked in config/): run
on every rank before the process group exists, so a bad input fails everywhere within seconds with one line."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from bigtrain.config.plan import Plan
from bigtrain.errors import ConfigError
from bigtrain.planner.memory_terms import GiB, offloaded_block_bytes, rank_seq_len
from bigtrain.planner.model_stats import ModelStats


def check_enough_rows(rows: int, global_batch: int, data_path: str) -> None:
    """Fewer sequences than one global batch would repeat sequences within a step."""
    if rows < global_batch:
        raise ConfigError(
            f"data.path={data_path!r} gives {rows} sequence(s), fewer than one global batch of "
            f"train.global_batch_size={global_batch}; use more data, a shorter data.seq_len, or a batch <= {rows}"
        )


def check_writable(output_dir: str) -> None:
    """output_dir (or the nearest folder that exists above it) must accept files: found now, not at the first
    checkpoint after the process group exists."""
    path = Path(output_dir).resolve()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ConfigError(f"output_dir={output_dir!r}: {str(existing)!r} is a file, not a folder; choose another path")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".bigtrain-write-test-"):
            pass
    except OSError as e:
        raise ConfigError(
            f"output_dir={output_dir!r} is not writable ({e.strerror or e}: {str(existing)!r}); choose a folder you "
            "can write to"
        ) from e


def check_offload_host_memory(
    plan: Plan, hf_config: Any, seq_len: int, dtype_bytes: int, local_ranks: int, available: int
) -> None:
    """``parallel.offload_activations`` needs host memory for one micro-batch's saved activations on every rank of
    the node (the planner's ``offloaded_block_bytes``): refused when ``available`` (the node's free memory) is short,
    before anything is allocated."""
    if not plan.offload_activations:
        return
    try:
        stats = ModelStats.from_config({**hf_config.to_dict(), "model_type": hf_config.model_type})
    except ConfigError:  # a family the planner does not model: nothing to predict with
        return
    rank_seq = rank_seq_len(plan, seq_len)
    need = offloaded_block_bytes(stats, plan, rank_seq, dtype_bytes, stats.layers)
    if need * local_ranks <= available:
        return
    full = offloaded_block_bytes(
        stats, replace(plan, activation_checkpointing="full", checkpoint_every=1), rank_seq, dtype_bytes, stats.layers
    )
    raise ConfigError(
        f"parallel.offload_activations=true keeps {need / GiB:.1f} GiB per rank in host memory "
        f"({need * local_ranks / GiB:.1f} GiB for the {local_ranks} ranks of this node), but only "
        f"{available / GiB:.1f} GiB is free; with activation_checkpointing: full it keeps {full / GiB:.1f} GiB per "
        "rank (the blocks' inputs only), or lower parallel.micro_batch_size or data.seq_len"
    )
