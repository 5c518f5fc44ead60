"""Token rows as flat files beside each other, written a chunk of rows at a time and read memory-mapped: the ids
(``rows.bin``, uint16 for vocabularies up to 65,536 ids, else uint32), which tokens are targets (``targets.bin``,
one byte each) and the position ids of packed documents (``positions.bin``, uint16 or uint32 by seq_len). Their
shapes live in the cache entry's ``meta.json`` (data/cache.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

CHUNK_ROWS = 4096  # rows buffered before a write: bounded memory whatever the data's size
ROWS, TARGETS, POSITIONS = "rows.bin", "targets.bin", "positions.bin"


def id_dtype(largest: int) -> np.dtype:
    return np.dtype(np.uint16) if largest < 2**16 else np.dtype(np.uint32)


class RowWriter:
    """Rows of ``seq_len`` appended to the files in ``folder`` (a data/packing.RowSink)."""

    def __init__(self, folder: Path, seq_len: int, vocab_size: int, targets: bool, positions: bool) -> None:
        self.seq_len = seq_len
        self.dtypes = {ROWS: id_dtype(vocab_size - 1), TARGETS: np.dtype(np.uint8), POSITIONS: id_dtype(seq_len - 1)}
        names = [ROWS] + [TARGETS] * targets + [POSITIONS] * positions
        self._files = {name: (folder / name).open("wb") for name in names}
        self._pending: dict[str, list[Any]] = {name: [] for name in names}
        self.num_rows = 0

    def add(self, ids: list[int], targets: list[bool] | None, positions: list[int] | None) -> None:
        for name, row in ((ROWS, ids), (TARGETS, targets), (POSITIONS, positions)):
            if name in self._pending:
                self._pending[name].append(row)
        self.num_rows += 1
        if len(self._pending[ROWS]) >= CHUNK_ROWS:
            self._write()

    def _write(self) -> None:
        for name, rows in self._pending.items():
            if rows:
                self._files[name].write(np.asarray(rows, dtype=self.dtypes[name]).tobytes())
                rows.clear()

    def close(self) -> dict[str, str]:
        """Write what is pending, close the files; the dtypes of the files written, for ``meta.json``."""
        self._write()
        for f in self._files.values():
            f.flush()
            f.close()
        return {name: self.dtypes[name].str for name in self._files}


def open_rows(folder: Path, num_rows: int, seq_len: int, dtypes: dict[str, str]) -> dict[str, np.ndarray | None]:
    """The files of ``folder`` memory-mapped, read-only: ``{rows, targets, positions}`` (None where not written)."""
    out: dict[str, np.ndarray | None] = {}
    for key, name in (("rows", ROWS), ("targets", TARGETS), ("positions", POSITIONS)):
        if name not in dtypes:
            out[key] = None
            continue
        mapped = np.memmap(folder / name, dtype=np.dtype(dtypes[name]), mode="r", shape=(num_rows, seq_len))
        out[key] = mapped.view(np.bool_) if name == TARGETS else mapped
    return out


class Ragged:
    """Examples of different lengths: example i is ``flat[offsets[i]:offsets[i + 1]]`` (mapped), read as int64."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray) -> None:
        self.flat, self.offsets = flat, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.flat[int(self.offsets[i]) : int(self.offsets[i + 1])], dtype=np.int64)


def open_ragged(folder: Path, flat_name: str, offsets_name: str, count: int, dtype: str) -> Ragged:
    """``count`` examples written as one flat file and its ``count + 1`` offsets (int64), mapped read-only."""
    offsets = np.memmap(folder / offsets_name, dtype=np.int64, mode="r", shape=(count + 1,))
    empty = not offsets[-1]  # numpy cannot map an empty file
    flat = np.zeros(0, np.dtype(dtype)) if empty else np.memmap(folder / flat_name, dtype=np.dtype(dtype), mode="r")
    return Ragged(flat, offsets)
