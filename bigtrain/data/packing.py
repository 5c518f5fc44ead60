"""Tokenised examples -> rows of ``seq_len`` (``data.packing``), written as they are made (memory flat in the data's
size: a row in the making at most).

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
from typing import Protocol

from bigtrain.data.formats import Example


class RowSink(Protocol):
    """Where finished rows go (data/row_files.py writes them to memory-mapped files)."""

    def add(self, ids: list[int], targets: list[bool] | None, positions: list[int] | None) -> None: ...


@dataclass
class PackCounts:
    examples: int  # examples read
    truncated: int  # examples cut to seq_len
    any_target: bool  # some row predicts a token (beyond its first position)


def layout(mode: str, masked: bool) -> tuple[bool, bool]:
    """Which per-row arrays a packing writes: (targets, positions). Stream rows carry targets only for masked
    examples (chat, instruction); documents and pad rows always do (their padding is not a target)."""
    return (masked or mode != "stream"), mode == "documents"


def pack(examples: Iterable[Example], seq_len: int, mode: str, pad_id: int, sink: RowSink) -> PackCounts:
    if mode == "stream":
        return _stream(examples, seq_len, sink)
    row = _Row(seq_len, pad_id, mode == "documents", sink)
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
        if count > 1 and (mode == "pad" or len(row.ids) + len(ids) > seq_len):
            row.flush()
        row.ids.extend(ids)
        row.marks.extend(marks)
        row.positions.extend(range(len(ids)))
    if count:
        row.flush()
    return PackCounts(count, truncated, row.any_target)


class _Row:
    """The row being filled, padded and handed to the sink when the next example does not fit."""

    def __init__(self, seq_len: int, pad_id: int, with_positions: bool, sink: RowSink) -> None:
        self.seq_len, self.pad_id, self.with_positions, self.sink = seq_len, pad_id, with_positions, sink
        self.ids: list[int] = []
        self.marks: list[bool] = []
        self.positions: list[int] = []
        self.any_target = False

    def flush(self) -> None:
        fill = self.seq_len - len(self.ids)
        # a target at a row's first position is never predicted (nothing comes before it in the row)
        self.any_target = self.any_target or any(self.marks[1:])
        positions = self.positions + list(range(fill)) if self.with_positions else None
        self.sink.add(self.ids + [self.pad_id] * fill, self.marks + [False] * fill, positions)
        self.ids, self.marks, self.positions = [], [], []


def _stream(examples: Iterable[Example], seq_len: int, sink: RowSink) -> PackCounts:
    """Examples concatenated and cut; targets kept only when the examples carry them (one format per source)."""
    ids: list[int] = []
    marks: list[bool] = []
    count = 0
    masked = False
    any_target = False
    for ex in examples:
        count += 1
        masked = masked or ex.targets is not None
        ids.extend(ex.ids)
        if masked:
            marks.extend(ex.targets if ex.targets is not None else [True] * len(ex.ids))
        done = len(ids) // seq_len * seq_len
        for start in range(0, done, seq_len):
            row_marks = marks[start : start + seq_len] if masked else None
            any_target = any_target or (row_marks is None or any(row_marks[1:]))
            sink.add(ids[start : start + seq_len], row_marks, None)
        if done:
            del ids[:done]
            del marks[:done]
    return PackCounts(count, 0, any_target)
