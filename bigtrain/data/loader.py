"""This rank's micro-batches of each optimizer step (and of each evaluation), on the device, with the
predicted-token count."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from bigtrain.data.batch import MicroBatch
from bigtrain.data.labels import labelled_positions
from bigtrain.data.order import GlobalOrder
from bigtrain.data.sources import TokenRows


@dataclass(frozen=True)
class StepBatch:
    micro_batches: list[MicroBatch]  # on the device
    tokens: int  # what the objective counts in them, labelled positions for a causal LM (on the host: no sync)
    # the step's metrics made with its data, the same on every rank (grpo's rewards of the generated completions)
    metrics: dict[str, float] = field(default_factory=dict)
    # of the time the step waited for this batch, the seconds it computed rather than read (grpo's generation,
    # scoring and log-probabilities): not counted as waiting for data
    computed_s: float = 0.0
    # tokens the whole global batch trains on where its rows differ in length (grpo's prompts and completions);
    # 0: global batch x rows per example x row length
    trained_tokens: int = 0


@dataclass
class RankReader:
    """Reads rows for data-parallel rank ``dp_rank`` of ``dp_size``, in micro-batches of ``micro_batch_size``."""

    data: TokenRows
    dp_rank: int
    dp_size: int
    micro_batch_size: int
    device: torch.device
    # context parallelism: this rank reads its slice ``cp_rank`` of ``cp_size`` of every row it reads
    cp_rank: int = field(default=0, kw_only=True)
    cp_size: int = field(default=1, kw_only=True)
    # what the objective normalises by in a micro-batch's labels (the engine's objective.count), counted on the host
    count: Callable[[torch.Tensor], int] = field(default=labelled_positions, kw_only=True)
    # right-padded rows (data.packing: pad): each micro-batch cut after its last predicted position, to a multiple of
    # this (train/padding.py decides it from the plan); 0: the rows' full length
    trim_to: int = field(default=0, kw_only=True)

    def _read(self, index: np.ndarray, filler: np.ndarray | None = None, seen: np.ndarray | None = None) -> StepBatch:
        return self._to_device(*self._host(index, filler, seen))

    def _to_device(self, micro: list[Any], count: int) -> StepBatch:
        if self.device.type == "cuda":  # pinned host memory: the copy to the GPU does not block the host
            micro = [m.pin_memory() for m in micro]
        return StepBatch([m.to(self.device) for m in micro], count)

    def _host(
        self, index: np.ndarray, filler: np.ndarray | None = None, seen: np.ndarray | None = None
    ) -> tuple[list[Any], int]:
        """Rows ``index`` ([micro-batches, micro_batch_size]) as host micro-batches, and what the objective counts
        in them; rows marked in ``filler`` are read, but predict nothing (their labels are all ignored); ``seen``:
        each row's position in the endless global order, which seeds a training image's augmentation (the same
        image at the same step whatever the plan)."""
        micro = []
        for i, rows in enumerate(index):
            batch = self.data.micro_batch(rows, None if seen is None else seen[i])
            if filler is not None and filler[i].any():
                batch = batch.without_labels(torch.from_numpy(filler[i]))
            if self.trim_to:
                batch = batch.trimmed(self.trim_to)
            if self.cp_size > 1:
                batch = batch.sequence_slice(self.cp_rank, self.cp_size)
            micro.append(batch)
        return micro, sum(self.count(m.labels) for m in micro)


@dataclass
class StepLoader(RankReader):
    """The rows the global order assigns to this rank at each optimizer step."""

    order: GlobalOrder = field(kw_only=True)
    # data.workers: processes that read (decode, augment) the next steps' micro-batches while this one trains; 0: read
    # in the training process when the step asks
    workers: int = field(default=0, kw_only=True)
    steps: int = field(default=0, kw_only=True)  # the run's last step (workers read nothing beyond it); 0: endless
    _ahead: Iterator[tuple[list[Any], int]] | None = field(default=None, init=False, repr=False)
    _next: int = field(default=-1, init=False, repr=False)

    def close(self) -> None:
        """Stop the reading workers now (the run is over, or stopping): they are not left to the garbage collector."""
        ahead, self._ahead = self._ahead, None
        shutdown = getattr(ahead, "_shutdown_workers", None)  # torch's own clean stop of a DataLoader's workers
        if shutdown is not None:
            shutdown()

    def host_step(self, step: int) -> tuple[list[Any], int]:
        """Step ``step``'s micro-batches of this rank on the host, and their count."""
        where = (step, self.dp_rank, self.dp_size, self.micro_batch_size)
        return self._host(self.order.micro_batches(*where), seen=self.order.micro_positions(*where))

    def __call__(self, step: int) -> StepBatch:
        if self.workers == 0:
            return self._to_device(*self.host_step(step))
        if self._ahead is None or step != self._next:  # the first step asked, or a jump: read ahead from it
            from torch.utils.data import DataLoader

            steps = _StepsFrom(self, step, self.steps or None)
            # fork: the workers share the data as read (readers are closures, not pickled), as on Linux by default
            # before Python 3.14
            loader = DataLoader(
                steps, batch_size=None, num_workers=self.workers, prefetch_factor=2, multiprocessing_context="fork"
            )
            self._ahead = iter(loader)
        self._next = step + 1
        return self._to_device(*next(self._ahead))


@dataclass
class EvalLoader(RankReader):
    """The held-out rows in global-batch-sized chunks, each cut for this rank exactly as a training step is.

    Every rank runs the same number of forwards of the training step's shape (FSDP2's gathers and a pipeline
    schedule need that); the last chunk is filled with copies of row 0 whose labels are all ignored, so they add
    nothing to the loss or the count. The sum over ranks of each chunk is therefore the same for every plan. Rows in
    groups (``row_groups``: image buckets) are chunked group by group, each group's last chunk filled with its own
    first row.
    """

    global_batch_size: int = field(kw_only=True)

    def __iter__(self) -> Iterator[StepBatch]:
        groups = getattr(self.data, "row_groups", None)  # rows of shapes that cannot share a batch: group by group
        every = (
            [np.arange(self.data.num_rows)]
            if groups is None
            else [np.flatnonzero(groups == g) for g in np.unique(groups)]
        )
        per_rank = self.global_batch_size // self.dp_size
        for rows in every:
            for start in range(0, len(rows), self.global_batch_size):
                mine = np.arange(start, start + self.global_batch_size)[self.dp_rank * per_rank :][:per_rank]
                index = mine.reshape(-1, self.micro_batch_size)
                yield self._read(rows[np.where(index < len(rows), index, 0)], index >= len(rows))


class _StepsFrom(IterableDataset):
    """Steps ``start``, ``start + 1``, ... (up to ``stop``, excluded) of a loader, read by DataLoader workers: worker w
    of n reads the steps ``start + w + k*n``, and the DataLoader takes its workers' results in turn, so the steps
    arrive in order. A worker ends after the run's last step, so the run's end does not wait for it to be stopped."""

    def __init__(self, loader: StepLoader, start: int, stop: int | None) -> None:
        self.loader, self.start, self.stop = loader, start, stop

    def __iter__(self) -> Iterator[tuple[list[Any], int]]:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        step = self.start + worker
        while self.stop is None or step < self.stop:
            yield self.loader.host_step(step)
            step += workers
