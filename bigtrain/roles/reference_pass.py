"""``parallel.reference: precomputed``: the reference's log-probabilities of every pair, computed once before the first
step by the policy as it starts (the reference model by definition), and stored beside the run.

Stored in ``output_dir/reference_logps/<fingerprint>.npy`` ([pairs, 2] fp32, chosen and rejected), the fingerprint
being that of the pairs' tokens and labels: a resumed run reads them back and computes nothing (its policy has
trained since, so it could not); a fresh start computes its own, whatever an earlier run left there. Each
data-parallel rank computes the pairs an evaluation would give it (every rank the same number of forwards: sharded
parameters are gathered by all), the shares are summed over the ranks, and rank 0 publishes the file atomically.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bigtrain.config.capabilities.reference import ROLE, resolved_reference
from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.data.loader import EvalLoader
from bigtrain.data.preference import PreferencePairs
from bigtrain.engine import Engine
from bigtrain.errors import ConfigError
from bigtrain.roles.reference import LiveReference, engine_parts

log = logging.getLogger("bigtrain")
FOLDER = "reference_logps"


def stored_at(output_dir: str, data: PreferencePairs) -> Path:
    return Path(output_dir) / FOLDER / f"{data.fingerprint()}.npy"


def attach_precomputed(
    cfg: RecipeConfig, plan: Plan, engine: Engine, datasets: list[Any], resuming: bool, device: torch.device
) -> None:
    """Give every preference data set its reference log-probabilities when the plan precomputes them: computed now by
    the untrained policy on a fresh start (a file left by an earlier run in output_dir, perhaps of another model, is
    replaced), read back on a resume (the file must be there). Rank 0 reads and decides; every rank gets its values."""
    if resolved_reference(plan, (ROLE,), cfg.train.method) != "precomputed":
        return
    for data in datasets:
        if data is None:
            continue
        path = stored_at(cfg.output_dir, data)
        if not resuming:
            data.ref_logps = _compute(engine, data, plan.micro_batch_size, cfg.train.global_batch_size, device)
            if dist.get_rank() == 0:
                _publish(path, data.ref_logps)
                log.info("reference log-probabilities of %d pairs computed and stored in %s", data.num_rows, path)
            dist.barrier()
            continue
        found = [_read(path, data) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(found, src=0)  # every rank hears the same answer (no shared filesystem needed)
        if isinstance(found[0], str):
            raise ConfigError(found[0])
        data.ref_logps = found[0]


def _read(path: Path, data: PreferencePairs) -> np.ndarray | str:
    """The stored values, or why they cannot be used."""
    if not path.is_file():
        return (
            f"parallel.reference=precomputed: {path} is missing, and the policy has trained since the reference was "
            "computed; restore the file, or start the run afresh (checkpoint.resume=false)"
        )
    values = np.load(path)
    if values.shape != (data.num_rows, 2):
        return f"{path} holds {values.shape} values, not ({data.num_rows}, 2); start the run afresh to recompute it"
    return values


def _compute(engine: Engine, data: PreferencePairs, micro: int, batch: int, device: torch.device) -> np.ndarray:
    reference = LiveReference(engine.model_output, engine_parts(engine))
    loader = EvalLoader(data, engine.dp_rank, engine.dp_size, micro, device, global_batch_size=batch)
    values = torch.zeros(data.num_rows, 2, dtype=torch.float64)
    per_rank = batch // engine.dp_size
    for chunk, step in enumerate(loader):
        first = chunk * batch + engine.dp_rank * per_rank
        for i, micro_batch in enumerate(step.micro_batches):
            logps = reference.attach(micro_batch).ref_logps.double().cpu()
            pairs = logps.shape[0] // 2
            at = torch.arange(first + i * micro, first + i * micro + pairs)
            real = at < data.num_rows  # the last chunk's fillers add nothing
            values[at[real], 0] = logps[:pairs][real]
            values[at[real], 1] = logps[pairs:][real]
    summed = values.to(device)
    dist.all_reduce(summed)  # preference plans are data-parallel only: every rank is a data-parallel rank
    return summed.cpu().numpy().astype(np.float32)


def _publish(path: Path, values: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npy")
    np.save(partial, values)
    os.replace(partial, path)  # a crash leaves no half-written file under the name a resume reads
