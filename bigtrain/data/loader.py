"""This rank's micro-batches of each optimizer step (and of each evaluation), on the device, with the
predicted-token count."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from bigtrain.data.batch import MicroBatch
from bigtrain.data.labels import labelled_positions
from bigtrain.data.order import GlobalOrder
from bigtrain.data.sources import TokenRows


@dataclass(frozen=True)
class StepBatch:
    micro_batches: list[MicroBatch]  # on the device
    tokens: int  # what the objective counts in them, labelled positions for a causal LM (on the host: no sync)


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

    def _read(self, index: np.ndarray, filler: np.ndarray | None = None, seen: np.ndarray | None = None) -> StepBatch:
        """Rows ``index`` ([micro-batches, micro_batch_size]); rows marked in ``filler`` are read, but predict
        nothing (their labels are all ignored); ``seen``: each row's position in the endless global order, which
        seeds a training image's augmentation (the same image at the same step whatever the plan)."""
        micro = []
        for i, rows in enumerate(index):
            batch = self.data.micro_batch(rows, None if seen is None else seen[i])
            if filler is not None and filler[i].any():
                batch = batch.without_labels(torch.from_numpy(filler[i]))
            if self.cp_size > 1:
                batch = batch.sequence_slice(self.cp_rank, self.cp_size)
            micro.append(batch)
        return StepBatch([m.to(self.device) for m in micro], sum(self.count(m.labels) for m in micro))


@dataclass
class StepLoader(RankReader):
    """The rows the global order assigns to this rank at each optimizer step."""

    order: GlobalOrder = field(kw_only=True)

    def __call__(self, step: int) -> StepBatch:
        where = (step, self.dp_rank, self.dp_size, self.micro_batch_size)
        return self._read(self.order.micro_batches(*where), seen=self.order.micro_positions(*where))


@dataclass
class EvalLoader(RankReader):
    """The held-out rows in global-batch-sized chunks, each cut for this rank exactly as a training step is.

    Every rank runs the same number of forwards of the training step's shape (FSDP2's gathers and a pipeline
    schedule need that); the last chunk is filled with copies of row 0 whose labels are all ignored, so they add
    nothing to the loss or the count. The sum over ranks of each chunk is therefore the same for every plan.
    """

    global_batch_size: int = field(kw_only=True)

    def __iter__(self) -> Iterator[StepBatch]:
        rows = self.data.num_rows
        per_rank = self.global_batch_size // self.dp_size
        for start in range(0, rows, self.global_batch_size):
            mine = np.arange(start, start + self.global_batch_size)[self.dp_rank * per_rank :][:per_rank]
            index = mine.reshape(-1, self.micro_batch_size)
            yield self._read(np.where(index < rows, index, 0), index >= rows)
