"""This rank's micro-batches of each optimizer step, on the device, with the predicted-token count."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bigtrain.data.batch import MicroBatch
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
