"""The global sample order, which is the same whatever the plan.

Optimizer step k trains on global positions ``[k*B, (k+1)*B)`` of an endless sequence of epochs; each epoch is the
rows in file order, or a permutation seeded by ``seed + epoch`` when shuffling. A plan only decides which slice of
that global batch each data-parallel rank reads and how the slice is cut into micro-batches, so the samples (and, in
exact arithmetic, the gradient) of step k never depend on the plan.
"""

from __future__ import annotations

import numpy as np


class GlobalOrder:
    def __init__(self, num_rows: int, global_batch_size: int, shuffle: bool, seed: int) -> None:
        self.num_rows = num_rows
        self.global_batch_size = global_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self._perms: dict[int, np.ndarray] = {}

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_rows)
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng(self.seed + epoch).permutation(self.num_rows)}
        return self._perms[epoch]

    def global_batch(self, step: int) -> np.ndarray:
        """Row indices of optimizer step ``step`` (0-based), length B."""
        positions = np.arange(step * self.global_batch_size, (step + 1) * self.global_batch_size)
        epochs, within = np.divmod(positions, self.num_rows)
        out = np.empty_like(positions)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            out[mask] = self._epoch_order(int(epoch))[within[mask]]
        return out

    def micro_batches(self, step: int, dp_rank: int, dp_size: int, micro_batch_size: int) -> np.ndarray:
        """This rank's rows of step ``step`` as ``[accum_steps, micro_batch_size]``: a contiguous slice per rank."""
        per_rank = self.global_batch_size // dp_size
        mine = self.global_batch(step)[dp_rank * per_rank : (dp_rank + 1) * per_rank]
        return mine.reshape(-1, micro_batch_size)

    def micro_positions(self, step: int, dp_rank: int, dp_size: int, micro_batch_size: int) -> np.ndarray:
        """Where each row of ``micro_batches`` sits in the endless global order (step x B + its index in the global
        batch): which epoch's visit of the row it is, whatever the plan."""
        per_rank = self.global_batch_size // dp_size
        start = step * self.global_batch_size + dp_rank * per_rank
        return np.arange(start, start + per_rank).reshape(-1, micro_batch_size)
