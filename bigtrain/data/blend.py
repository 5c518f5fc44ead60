"""Several sources blended by weight into one global order (``data.sources``), the same at any world size and plan,
and read at once from any position (no replay to resume).

Position p of the endless global order is a function of p alone. The order runs in cycles of ``CYCLE`` slots; a
source of weight w owns round(w x CYCLE) slots of each cycle (largest remainders, at least one), spread evenly over
it (slot j of n at (j + 1/2) x CYCLE / n, all sources' slots sorted by that place), so every stretch of the order
holds each source in its share. The k-th slot of source s is its row k mod rows(s) in that source's epoch k //
rows(s): in file order, or with ``data.shuffle`` a permutation seeded by the seed, the source and the epoch. A
source's weight is given (``weight``), or follows from how often it is to be seen per blended epoch (``epochs``:
weight proportional to rows x epochs; the default, 1, blends the sources in proportion to their rows); a blended
epoch is sum(rows x epochs) positions, or sum(rows) with weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bigtrain.data.batch import MicroBatch, concat
from bigtrain.data.order import permutation
from bigtrain.errors import ConfigError

CYCLE = 10_000  # slots per cycle: weights are kept to 0.01%
SOURCE_KEYS = ("path", "weight", "epochs")


def check_sources(sources: list[dict[str, Any]]) -> None:
    """``data.sources``: each a mapping with a path and at most one of weight and epochs (positive numbers)."""
    for i, source in enumerate(sources):
        key = f"data.sources[{i}]"
        if not isinstance(source, dict) or not isinstance(source.get("path"), str):
            raise ConfigError(f"{key} must be a mapping with a path, e.g. {{path: web.bin, weight: 0.7}}")
        unknown = sorted(set(source) - set(SOURCE_KEYS))
        if unknown:
            raise ConfigError(f"{key} has the unknown keys {unknown}; a source has {', '.join(SOURCE_KEYS)}")
        if "weight" in source and "epochs" in source:
            raise ConfigError(f"{key} gives weight and epochs; give one (epochs: how often per blended epoch)")
        for name in ("weight", "epochs"):
            value = source.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                raise ConfigError(f"{key}.{name}={value!r} must be a positive number")
    given = {"weight" in s for s in sources}
    if len(given) > 1:
        raise ConfigError("data.sources: give every source a weight, or none (then epochs, default 1, decide)")


def slots_per_cycle(weights: np.ndarray) -> np.ndarray:
    """Each source's slots of a cycle: ``weights`` (summing to 1) x CYCLE by largest remainders, at least one."""
    exact = weights * CYCLE
    slots = np.maximum(np.floor(exact).astype(np.int64), 1)
    for s in np.argsort(-(exact - np.floor(exact)), kind="stable")[: CYCLE - int(slots.sum())]:
        slots[s] += 1
    while slots.sum() > CYCLE:  # the floor of one made a tiny weight's slot: taken from the largest
        slots[int(np.argmax(slots))] -= 1
    return slots


@dataclass
class BlendedRows:
    """Token rows of several sources (each a ``data.rows.TokenRows``) read in the blend's order: row ``p`` of a
    micro-batch is position p of the global order (training reads pass it as ``seen``)."""

    sources: list[Any]
    names: list[str]
    weights: np.ndarray  # [sources] summing to 1
    num_rows: int  # positions in a blended epoch
    shuffle: bool
    seed: int
    self_ordered = True  # the global order is the blend's: the loader's own shuffle would only permute positions
    index = None
    _pattern: np.ndarray = field(init=False, repr=False)
    _rank: np.ndarray = field(init=False, repr=False)
    _slots: np.ndarray = field(init=False, repr=False)
    _perms: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._slots = slots_per_cycle(self.weights)
        places = np.concatenate([(np.arange(n) + 0.5) * CYCLE / n for n in self._slots])
        owner = np.concatenate([np.full(n, s) for s, n in enumerate(self._slots)])
        order = np.lexsort((owner, places))
        self._pattern = owner[order]
        rank = np.empty(CYCLE, dtype=np.int64)
        for s in range(len(self.sources)):
            mine = np.flatnonzero(self._pattern == s)
            rank[mine] = np.arange(len(mine))
        self._rank = rank

    @property
    def seq_len(self) -> int:
        return self.sources[0].seq_len

    @property
    def vocab_size(self) -> int | None:
        sizes = [s.vocab_size for s in self.sources]
        return None if None in sizes else max(sizes)

    @property
    def positions(self) -> Any:  # packed documents in some source: every row then carries position ids
        return next((s.positions for s in self.sources if s.positions is not None), None)

    @property
    def truncated(self) -> int:
        return sum(s.truncated for s in self.sources)

    @property
    def examples(self) -> int:
        return sum(s.examples for s in self.sources)

    @property
    def cache_note(self) -> str | None:
        notes = [s.cache_note for s in self.sources if s.cache_note]
        return "; ".join(notes) if notes else None

    @property
    def description(self) -> str:
        parts = []
        for name, source, weight in zip(self.names, self.sources, self.weights, strict=True):
            epochs = weight * self.num_rows / source.num_rows
            parts.append(f"{name} {100 * weight:.1f}% ({source.num_rows} rows, {epochs:.2f} epochs per blended epoch)")
        return f"a blend of {len(self.sources)} sources, {self.num_rows} rows per blended epoch: " + "; ".join(parts)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, row in it) of each global position."""
        positions = np.asarray(positions, dtype=np.int64)
        cycle, slot = np.divmod(positions, CYCLE)
        source = self._pattern[slot]
        draw = cycle * self._slots[source] + self._rank[slot]
        rows = np.empty_like(positions)
        for s in np.unique(source):
            mine = source == s
            epoch, within = np.divmod(draw[mine], self.sources[s].num_rows)
            rows[mine] = [self._row(int(s), int(e), int(w)) for e, w in zip(epoch, within, strict=True)]
        return source, rows

    def _row(self, source: int, epoch: int, within: int) -> int:
        if not self.shuffle:
            return within
        key = (source, epoch)
        if key not in self._perms:
            if len(self._perms) > 2 * len(self.sources):  # a few epochs per source in reach: bounded memory
                self._perms.clear()
            rng = np.random.default_rng([self.seed, source, epoch])
            self._perms[key] = permutation(rng, self.sources[source].num_rows)
        return int(self._perms[key][within])

    def micro_batch(self, rows: np.ndarray, seen: np.ndarray | None = None) -> MicroBatch:
        """The rows at global positions ``seen`` (training), or at positions ``rows`` of the order's start."""
        source, at = self.locate(rows if seen is None else seen)
        packed = self.positions is not None
        batches = []
        for s, r in zip(source, at, strict=True):
            batch = self.sources[s].micro_batch(np.array([r]))
            if packed and batch.position_ids is None:  # a stream row beside packed ones: positions 0..seq_len-1
                batch = MicroBatch(batch.input_ids, batch.labels, torch.arange(self.seq_len)[None, :])
            batches.append(batch)
        return concat(batches)


def blend(sources: list[Any], names: list[str], specs: list[dict[str, Any]], shuffle: bool, seed: int) -> BlendedRows:
    """The blend of ``sources`` (their ``data.sources`` entries ``specs``): weights normalised, or from epochs."""
    lengths = {s.seq_len for s in sources}
    if len(lengths) > 1:
        raise ConfigError(f"data.sources give rows of {sorted(lengths)} tokens; every source needs data.seq_len")
    rows = np.array([s.num_rows for s in sources], dtype=np.float64)
    if all("weight" in spec for spec in specs):
        weights = np.array([float(spec["weight"]) for spec in specs])
        epoch = int(rows.sum())
    else:
        epochs = np.array([float(spec.get("epochs", 1.0)) for spec in specs])
        weights = rows * epochs
        epoch = int(math.ceil(weights.sum()))
    return BlendedRows(sources, names, weights / weights.sum(), epoch, shuffle, seed)
