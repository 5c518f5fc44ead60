"""This rank's micro-batches of each optimizer step, as tensors on the device, with their predicted-token count."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bigtrain.data.labels import predicted_tokens
from bigtrain.data.order import GlobalOrder
from bigtrain.data.sources import TokenRows


@dataclass(frozen=True)
class StepBatch:
    micro_batches: list[torch.Tensor]  # [micro_batch_size, seq_len] token ids each, on the device
    tokens: int  # next-token targets in them (counted on the host: no device sync)


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
        host = [torch.from_numpy(np.asarray(self.data.rows[rows], dtype=np.int64)) for rows in index]
        return StepBatch([t.to(self.device) for t in host], sum(predicted_tokens(t) for t in host))
