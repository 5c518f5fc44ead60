"""This rank's micro-batches of each optimizer step (and of each evaluation), on the device, with the
predicted-token count."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from bigtrain.data.batch import MicroBatch
from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.data.order import GlobalOrder
from bigtrain.data.sources import TokenRows


@dataclass(frozen=True)
class StepBatch:
    micro_batches: list[MicroBatch]  # on the device
    tokens: int  # labelled positions in them (counted on the host: no device sync)


class StepLoader:
    """Reads the rows the global order assigns to data-parallel rank ``dp_rank`` at each step."""

    def __init__(
        self,
        data: TokenRows,
        order: GlobalOrder,
        dp_rank: int,
        dp_size: int,
        micro_batch_size: int,
        device: torch.device,
    ) -> None:
        self.data = data
        self.order = order
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.micro_batch_size = micro_batch_size
        self.device = device

    def __call__(self, step: int) -> StepBatch:
        index = self.order.micro_batches(step, self.dp_rank, self.dp_size, self.micro_batch_size)
        host = [self.data.micro_batch(rows) for rows in index]
        return StepBatch([m.to(self.device) for m in host], sum(m.predicted_tokens() for m in host))


class EvalLoader:
    """The held-out rows in global-batch-sized chunks, each cut for this rank exactly as a training step is.

    Every rank runs the same number of forwards of the training step's shape (FSDP2's gathers and a pipeline
    schedule need that); the last chunk is filled with copies of row 0 whose labels are all ignored, so they add
    nothing to the loss or the count. The sum over ranks of each chunk is therefore the same for every plan.
    """

    def __init__(
        self,
        data: TokenRows,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        micro_batch_size: int,
        device: torch.device,
    ) -> None:
        self.data = data
        self.global_batch_size = global_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.micro_batch_size = micro_batch_size
        self.device = device

    def __iter__(self) -> Iterator[StepBatch]:
        rows = self.data.num_rows
        per_rank = self.global_batch_size // self.dp_size
        for start in range(0, rows, self.global_batch_size):
            positions = np.arange(start, start + self.global_batch_size)[self.dp_rank * per_rank :][:per_rank]
            micro = []
            for chunk in positions.reshape(-1, self.micro_batch_size):
                batch = self.data.micro_batch(np.where(chunk < rows, chunk, 0))
                filler = torch.from_numpy(chunk >= rows)
                micro.append(replace(batch, labels=batch.labels.masked_fill(filler[:, None], IGNORE_INDEX)))
            yield StepBatch([m.to(self.device) for m in micro], sum(m.predicted_tokens() for m in micro))
