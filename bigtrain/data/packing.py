"""Tokenised examples -> rows of ``seq_len`` (``data.packing``).

- stream: all examples concatenated and cut into rows; the ragged tail is dropped. Documents see each other (the
  pre-training convention) and a document may continue in the next row.
- documents: whole examples placed one after another into rows; one that does not fit in what is left of a row
  starts the next row, the rest of the row is padding. Position ids restart at each example, which keeps attention
  inside it (see data/batch.py). An example longer than a row is truncated.
- pad: one example per row, right-padded (causal attention never looks ahead, so the padding changes nothing for
  the tokens before it); longer examples are truncated.

Padding is the end-of-document id and is never a target.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from bigtrain.data.formats import Example


@dataclass
class PackedRows:
    rows: np.ndarray  # [n, seq_len] int64 token ids
    targets: np.ndarray | None  # [n, seq_len] bool: which tokens are predicted; None: all
    positions: np.ndarray | None  # [n, seq_len] int32 position ids restarting per example; None: 0..seq_len-1
    examples: int
    truncated: int  # examples cut to seq_len


def pack(examples: Iterable[Example], seq_len: int, mode: str, pad_id: int) -> PackedRows:
    if mode == "stream":
        return _stream(examples, seq_len)
    rows: list[list[int]] = []
    targets: list[list[bool]] = []
    positions: list[list[int]] = []
    count = truncated = 0
    for ex in examples:
        count += 1
        ids = ex.ids
        marks = ex.targets if ex.targets is not None else [True] * len(ids)
        if len(ids) > seq_len:
            ids, marks = ids[:seq_len], marks[:seq_len]
            truncated += 1
        # the first token of an example is never predicted: from the row's previous example it would be a guess
        # across documents
        marks = [False, *marks[1:]]
        if mode == "pad" or not rows or len(rows[-1]) + len(ids) > seq_len:
            rows.append([])
            targets.append([])
            positions.append([])
        rows[-1].extend(ids)
        targets[-1].extend(marks)
        positions[-1].extend(range(len(ids)))
    for r, t, p in zip(rows, targets, positions, strict=True):
        fill = seq_len - len(r)
        r.extend([pad_id] * fill)
        t.extend([False] * fill)
        p.extend(range(fill))
    shape = (len(rows), seq_len)
    return PackedRows(
        np.asarray(rows, dtype=np.int64).reshape(shape),
        np.asarray(targets, dtype=bool).reshape(shape),
        np.asarray(positions, dtype=np.int32).reshape(shape) if mode == "documents" else None,
        count,
        truncated,
    )


def _stream(examples: Iterable[Example], seq_len: int) -> PackedRows:
    ids: list[int] = []
    marks: list[bool] | None = None  # built only once some example is masked (text alone needs none)
    count = 0
    for ex in examples:
        count += 1
        if ex.targets is not None and marks is None:
            marks = [True] * len(ids)
        if marks is not None:
            marks.extend(ex.targets if ex.targets is not None else [True] * len(ex.ids))
        ids.extend(ex.ids)
    n = len(ids) // seq_len
    rows = np.asarray(ids[: n * seq_len], dtype=np.int64).reshape(n, seq_len)
    targets = None if marks is None else np.asarray(marks[: n * seq_len], dtype=bool).reshape(n, seq_len)
    return PackedRows(rows, targets, None, count, 0)
