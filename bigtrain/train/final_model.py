"""The finished run's model, written by rank 0 from its last checkpoint once the process group is gone: an HF folder
(``output_dir/model``), or for an adapter run peft's adapter folder (``output_dir/adapter``)."""

from __future__ import annotations

import logging
from pathlib import Path

from bigtrain.checkpoint.adapter_export import export_adapter
from bigtrain.checkpoint.export import export_model
from bigtrain.checkpoint.run_dir import FINAL_ADAPTER, FINAL_MODEL
from bigtrain.checkpoint.storage import is_disk_full, storage_problem
from bigtrain.config.schema import ADAPTER_METHODS, RecipeConfig
from bigtrain.errors import CheckpointNotWritten
from bigtrain.job import Job
from bigtrain.train.loop import TrainResult

log = logging.getLogger("bigtrain")


def write_final_model(cfg: RecipeConfig, result: TrainResult, job: Job) -> None:
    """Rank 0: the finished run's last checkpoint as an HF folder in output_dir/model, or for an adapter run as
    peft's adapter folder in output_dir/adapter (unless opted out)."""
    if not cfg.checkpoint.save_final_model or result.stopped or result.checkpoint is None:
        return
    adapters = cfg.train.method in ADAPTER_METHODS
    out = Path(cfg.output_dir) / (FINAL_ADAPTER if adapters else FINAL_MODEL)
    try:
        if adapters:
            export_adapter(result.checkpoint, out, job.task.peft_task_type)
        else:
            export_model(result.checkpoint, out)
    except Exception as e:  # an OSError, or safetensors' own SafetensorError (not an OSError) for a full disk
        if not is_disk_full(e, out):
            raise
        raise CheckpointNotWritten(
            f"the final model could not be written to {out}: {storage_problem(e, out)}; the last checkpoint "
            f"{result.checkpoint} holds it: free space, then bigtrain export-model {result.checkpoint} -o {out}"
        ) from e
    log.info("final %s (step %d) written to %s", "adapter" if adapters else "model", result.last_step, out)
