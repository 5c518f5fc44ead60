"""The global sample order, which is the same whatever the plan.

Optimizer step k trains on global positions ``[k*B, (k+1)*B)`` of an endless sequence of epochs; each epoch is the
rows in file order, or a permutation seeded by ``seed + epoch`` when shuffling. A plan only decides which slice of
that global batch each data-parallel rank reads and how the slice is cut into micro-batches, so the samples (and, in
exact arithmetic, the gradient) of step k never depend on the plan.

Rows of unequal cost (a conversation's images: the vision tower's work grows with their pixels) are dealt instead of
sliced: each step's rows go, costliest first, to the rank and micro-step with the least cost so far (``balanced``),
so that no rank waits on one that drew the large images and no micro-batch holds all of them. The step's rows, and
so its gradient, are the same; only who computes which changes.

Rows of different shapes that cannot share a micro-batch (images in aspect-ratio buckets) are ordered by group
instead: each global batch from one group (``data/aspect_buckets.py``, ``epoch_batches``).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from bigtrain.data.aspect_buckets import batches_per_epoch, epoch_batches


class GlobalOrder:
    def __init__(
        self,
        num_rows: int,
        global_batch_size: int,
        shuffle: bool,
        seed: int,
        costs: np.ndarray | None = None,
        groups: np.ndarray | None = None,
    ) -> None:
        """``costs``: each row's cost to compute, when rows differ; ``groups``: each row's group, when a global batch
        must come from one (see the module's docstring)."""
        self.num_rows = num_rows
        self.global_batch_size = global_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.costs = None if costs is None or len(np.unique(costs)) <= 1 else np.asarray(costs)
        self.groups = groups
        self.steps_per_epoch = 0 if groups is None else batches_per_epoch(groups, global_batch_size)
        self._perms: dict[int, np.ndarray] = {}
        self._dealt: tuple[tuple[int, int], list[np.ndarray]] | None = None  # the last step's bins (rows, positions)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: permutation(np.random.default_rng(self.seed + epoch), self.num_rows)}
        return self._perms[epoch]

    @classmethod
    def of_rows(cls, data: Any, global_batch_size: int, shuffle: bool, seed: int) -> GlobalOrder:
        """The order of ``data``'s rows: dealt by cost where their costs differ (``row_costs``: images), drawn by
        group where they cannot share a batch (``row_groups``: image buckets)."""
        costs, groups = getattr(data, "row_costs", None), getattr(data, "row_groups", None)
        return cls(data.num_rows, global_batch_size, shuffle, seed, costs, groups)

    def _grouped_epoch(self, epoch: int) -> np.ndarray:
        assert self.groups is not None
        if epoch not in self._perms:
            rng = np.random.default_rng(self.seed + epoch) if self.shuffle else None
            self._perms = {epoch: epoch_batches(self.groups, self.global_batch_size, rng)}
        return self._perms[epoch]

    def global_batch(self, step: int) -> np.ndarray:
        """Row indices of optimizer step ``step`` (0-based), length B."""
        if self.groups is not None:
            epoch, k = divmod(step, self.steps_per_epoch)
            return self._grouped_epoch(epoch)[k]
        positions = np.arange(step * self.global_batch_size, (step + 1) * self.global_batch_size)
        epochs, within = np.divmod(positions, self.num_rows)
        if not self.shuffle:  # file order: the row is where the position falls in its epoch (no order array kept)
            return within
        out = np.empty_like(positions)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            out[mask] = self._epoch_order(int(epoch))[within[mask]]
        return out

    def micro_batches(self, step: int, dp_rank: int, dp_size: int, micro_batch_size: int) -> np.ndarray:
        """This rank's rows of step ``step`` as ``[accum_steps, micro_batch_size]``: a contiguous slice per rank (or,
        for rows of unequal cost, the rows ``balanced`` deals it)."""
        return self._mine(self.global_batch(step), step, dp_rank, dp_size, micro_batch_size)

    def micro_positions(self, step: int, dp_rank: int, dp_size: int, micro_batch_size: int) -> np.ndarray:
        """Where each row of ``micro_batches`` sits in the endless global order (step x B + its index in the global
        batch): which epoch's visit of the row it is, whatever the plan."""
        batch = self.global_batch_size
        positions = np.arange(step * batch, (step + 1) * batch)
        return self._mine(positions, step, dp_rank, dp_size, micro_batch_size)

    def _mine(self, values: np.ndarray, step: int, dp_rank: int, dp_size: int, micro_batch_size: int) -> np.ndarray:
        per_rank = self.global_batch_size // dp_size
        if self.costs is None:
            return values[dp_rank * per_rank : (dp_rank + 1) * per_rank].reshape(-1, micro_batch_size)
        # bin b is micro-step b // dp_size of rank b % dp_size: the costliest rows go to different ranks first
        bins = self._bins(step, micro_batch_size)
        return np.stack([values[bins[dp_rank + dp_size * m]] for m in range(per_rank // micro_batch_size)])

    def _bins(self, step: int, micro_batch_size: int) -> list[np.ndarray]:
        """Step ``step``'s rows dealt into bins of a micro-batch, once per step (its rows and their positions both
        read them)."""
        assert self.costs is not None
        if self._dealt is None or self._dealt[0] != (step, micro_batch_size):
            costs = self.costs[self.global_batch(step)]
            self._dealt = (step, micro_batch_size), balanced(costs, len(costs) // micro_batch_size, micro_batch_size)
        return self._dealt[1]


def permutation(rng: np.random.Generator, n: int) -> np.ndarray:
    """``rng.permutation(n)``, the same order, held in 4 bytes a row below 2**31 rows instead of 8: shuffling an
    int32 range draws what shuffling permutation's int64 range draws."""
    if n >= 2**31:
        return rng.permutation(n)
    out = np.arange(n, dtype=np.int32)
    rng.shuffle(out)
    return out


def balanced(costs: np.ndarray, bins: int, capacity: int) -> list[np.ndarray]:
    """The rows (indices into ``costs``) dealt into ``bins`` bins of ``capacity`` rows: costliest first (the earlier
    row on a tie), each to the bin with the least cost so far that has room (the lower bin on a tie); each bin's
    rows in their own order."""
    open_bins = [(0.0, b) for b in range(bins)]  # (cost so far, bin) of the bins with room: a heap, least first
    members: list[list[int]] = [[] for _ in range(bins)]
    for row in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, chosen = heapq.heappop(open_bins)
        members[chosen].append(row)
        if len(members[chosen]) < capacity:
            heapq.heappush(open_bins, (load + float(costs[row]), chosen))
    return [np.array(sorted(rows), dtype=np.int64) for rows in members]
