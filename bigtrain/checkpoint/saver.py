"""Saving checkpoints during a run: every rank writes its own part with DCP, rank 0 publishes and prunes.

A save is collective: every rank calls ``save`` at the same step boundary. With ``checkpoint.async``, DCP copies
this rank's state to host memory before ``async_save`` returns (so the next optimizer step may change the
parameters) and writes it in a background thread that talks over its own gloo group, never the training group. At
most one save is in flight; the next save, and the end of the run, wait for it. Publishing (manifest, rename,
pruning) happens on rank 0 once its DCP call has finished, which is after every rank's files are written: DCP's
coordinator writes ``.metadata`` only after gathering every rank's write results.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from bigtrain.checkpoint.base_model import base_record
from bigtrain.checkpoint.cadence import Cadence
from bigtrain.checkpoint.export import HfFiles, write_hf_files
from bigtrain.checkpoint.layout import (
    HF_FILES,
    RECIPE,
    Manifest,
    checkpoints_dir,
    file_checksum,
    gather_checksums,
    list_files,
    newest_checkpoint,
    partial_dir,
    prune,
    publish,
    step_dir,
    write_rank_checksums,
)
from bigtrain.checkpoint.state import capture
from bigtrain.checkpoint.storage import storage_problem
from bigtrain.config.load import dump_recipe
from bigtrain.config.plan import Plan
from bigtrain.config.schema import ADAPTER_METHODS, RecipeConfig
from bigtrain.engine.base import Engine
from bigtrain.errors import CheckpointNotWritten, peer_failure

log = logging.getLogger("bigtrain")


@dataclass(frozen=True)
class _Pending:
    future: Future
    step: int
    tokens: int


class Checkpointer:
    def __init__(
        self,
        cfg: RecipeConfig,
        plan: Plan,
        hf_config: Any,
        engine: Engine,
        data_info: dict[str, Any],
        device: torch.device,
        files: HfFiles,
        stream_position: Callable[[int], str] | None = None,
    ) -> None:
        """``files``: what the run's task keeps beside the weights (its tokenizer, image processor or processor),
        written into every checkpoint's ``hf/`` folder and so into the final model; ``stream_position``: a streamed
        source's position after a step (data/stream.py), saved with it."""
        self.cfg = cfg
        self.files = files
        self.plan = plan
        self.hf_config = hf_config
        self.engine = engine
        self.data_info = data_info
        self.device = device
        self.stream_position = stream_position
        self.rank = dist.get_rank()
        self.root = checkpoints_dir(cfg.output_dir)
        # Created on every rank now (creating a group is collective); used only by the background writer.
        self._group = dist.new_group(backend="gloo") if cfg.checkpoint.async_save else None
        self._pending: _Pending | None = None
        self.saved_step = -1  # the last step a save was started for (the same on every rank)
        self.last_published: Path | None = None  # rank 0 only
        # what a step source that makes the batches (grpo's rollouts) keeps for the steps after a step, per rank
        self.step_source_state: Callable[[int], str | None] | None = None
        # an adapter run's checkpoints omit the frozen base: they name it and pin its files (rank 0 writes it)
        adapters = cfg.train.method in ADAPTER_METHODS and self.rank == 0
        self.base = base_record(cfg.model.name_or_path) if adapters else None
        self.cadence = Cadence(cfg.checkpoint, dist.get_world_size(), device, self.rank == 0)

    def due(self, step: int) -> bool:
        return self.cadence.due(step)

    def save(self, step: int, tokens: int) -> None:
        """Save the state after ``step`` optimizer steps (collective: every rank, same step)."""
        start = time.perf_counter()
        self._save(step, tokens)
        self.cadence.saved(time.perf_counter() - start)  # what the loop waited: checkpoint.every auto measures it

    def _save(self, step: int, tokens: int) -> None:
        self.wait()
        stream = self.stream_position(step) if self.stream_position is not None else None
        own = self.step_source_state(step) if self.step_source_state is not None else None
        state = capture(self.engine, step, tokens, self.rank, self.device, stream, own)
        partial = partial_dir(self.root, step)
        self.saved_step = step
        try:
            if self._group is None:
                dcp.save(state, checkpoint_id=partial)
                write_rank_checksums(partial, self.rank)
            else:
                future = dcp.async_save(state, checkpoint_id=partial, process_group=self._group)
                # in the writer's thread as soon as this rank's shards are on disk: no step of the loop waits for it
                future.add_done_callback(lambda done: done.exception() or write_rank_checksums(partial, self.rank))
                self._pending = _Pending(future, step, tokens)
                return
        except (Exception, CheckpointException) as e:  # DCP gathers every rank's write result: every rank is here
            self._not_written(step, e)
        self._finished(step, tokens)

    def poll(self) -> None:
        """Publish a background save that has finished (cheap; called at every step boundary)."""
        self.cadence.stepped()
        if self._pending is not None and self._pending.future.done():
            self.wait()

    def wait(self) -> None:
        """Block until the save in flight, if any, is written and published; re-raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.future.result()
            except (Exception, CheckpointException) as e:  # as in save: every rank's background write failed together
                self._not_written(pending.step, e)
            self._finished(pending.step, pending.tokens)

    def _not_written(self, step: int, error: BaseException) -> NoReturn:
        """One line instead of DCP's traceback (its CheckpointException, a BaseException, holds each rank's error):
        which checkpoint failed and why, the partial folder removed (rank 0), and the last good checkpoint, which
        stays intact and resumable. A save that failed because another rank died or stopped answering is not the
        disk's fault: that error goes on as it is (the command line names it, with the last good checkpoint)."""
        peer = peer_failure(error)
        if peer is not None:
            raise peer from error
        partial = partial_dir(self.root, step)
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
        last = newest_checkpoint(self.root)
        raise CheckpointNotWritten(
            f"the checkpoint of step {step} could not be written to {partial}: {storage_problem(error, self.root)}; "
            f"its partial folder is removed. The last good checkpoint is "
            + (f"{last}: free space and start again to resume from it" if last else "none (no save completed yet)")
        ) from error

    def _finished(self, step: int, tokens: int) -> None:
        """Rank 0 completes the save every rank wrote: recipe, HF files, manifest, then the publishing rename."""
        if self.rank != 0:
            return
        try:
            final = self._publish(step, tokens)
        except Exception as e:  # noqa: BLE001 - a full disk while writing the small files, said in one line too
            self._not_written(step, e)
        prune(self.root, self.cfg.checkpoint.keep)
        self.last_published = final
        log.info("checkpoint: step %d saved to %s", step, final)

    def _publish(self, step: int, tokens: int) -> Path:
        """The small files and the manifest into the partial folder, then its rename: the checkpoint exists."""
        partial, final = partial_dir(self.root, step), step_dir(self.root, step)
        shard_sums = gather_checksums(partial, dist.get_world_size(), self.cfg.train.collective_timeout_s)
        (partial / RECIPE).write_text(dump_recipe(self.cfg))
        write_hf_files(partial / HF_FILES, self.hf_config, self.cfg.model.name_or_path, self.files)
        files = list_files(partial)
        Manifest(
            step=step,
            tokens=tokens,
            samples=step * self.cfg.train.global_batch_size,
            world_size=dist.get_world_size(),
            plan=self.plan.to_dict(),
            data=self.data_info,
            files=files,
            torch_version=torch.__version__,
            base=self.base,
            # the shards' as their writers computed them; rank 0 reads only the small files it wrote
            checksums={n: shard_sums.get(n) or file_checksum(partial / n) for n in files},
        ).write(partial)
        publish(partial, final)
        return final
