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
from typing import Any, Protocol

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
    packer = Packer(seq_len, mode, pad_id, sink)
    for ex in examples:
        packer.add(ex)
    packer.finish()
    return packer.counts()


class Packer:
    """Examples in, finished rows out to ``sink`` as soon as they are complete; what is not finished yet (the row in
    the making, or the stream's ragged tail) is its ``carry``, from which a restored packer goes on exactly (a
    stream's position in a checkpoint: data/stream.py)."""

    def __init__(self, seq_len: int, mode: str, pad_id: int, sink: RowSink) -> None:
        self.seq_len, self.mode, self.pad_id, self.sink = seq_len, mode, pad_id, sink
        self.ids: list[int] = []
        self.marks: list[bool] = []
        self.positions: list[int] = []
        self.masked = False  # stream: the examples carry targets (one format per source)
        self.examples = self.truncated = 0
        self.any_target = False

    def add(self, ex: Example) -> None:
        self.examples += 1
        if self.mode == "stream":
            self._add_stream(ex)
            return
        ids = ex.ids
        marks = ex.targets if ex.targets is not None else [True] * len(ids)
        if len(ids) > self.seq_len:
            ids, marks = ids[: self.seq_len], marks[: self.seq_len]
            self.truncated += 1
        # the first token of an example is never predicted: from the row's previous example it would be a guess
        # across documents
        marks = [False, *marks[1:]]
        if self.ids and (self.mode == "pad" or len(self.ids) + len(ids) > self.seq_len):
            self._flush()
        self.ids.extend(ids)
        self.marks.extend(marks)
        self.positions.extend(range(len(ids)))

    def finish(self) -> None:
        """The last row of documents or pad, padded (a stream's ragged tail is dropped)."""
        if self.mode != "stream" and self.ids:
            self._flush()

    def counts(self) -> PackCounts:
        return PackCounts(self.examples, self.truncated, self.any_target)

    def carry(self) -> dict[str, Any]:
        """What a restored packer needs to go on: the unfinished row (or tail) and the stream's target flag."""
        return {"ids": list(self.ids), "marks": list(self.marks), "positions": list(self.positions),
                "masked": self.masked}  # fmt: skip

    def restore(self, carry: dict[str, Any]) -> None:
        self.ids, self.marks, self.positions = list(carry["ids"]), list(carry["marks"]), list(carry["positions"])
        self.masked = bool(carry["masked"])

    def _flush(self) -> None:
        fill = self.seq_len - len(self.ids)
        # a target at a row's first position is never predicted (nothing comes before it in the row)
        self.any_target = self.any_target or any(self.marks[1:])
        positions = self.positions + list(range(fill)) if self.mode == "documents" else None
        self.sink.add(self.ids + [self.pad_id] * fill, self.marks + [False] * fill, positions)
        self.ids, self.marks, self.positions = [], [], []

    def _add_stream(self, ex: Example) -> None:
        """Examples concatenated and cut; targets kept only when the examples carry them."""
        seq_len = self.seq_len
        self.masked = self.masked or ex.targets is not None
        self.ids.extend(ex.ids)
        if self.masked:
            self.marks.extend(ex.targets if ex.targets is not None else [True] * len(ex.ids))
        done = len(self.ids) // seq_len * seq_len
        for start in range(0, done, seq_len):
            row_marks = self.marks[start : start + seq_len] if self.masked else None
            self.any_target = self.any_target or (row_marks is None or any(row_marks[1:]))
            self.sink.add(self.ids[start : start + seq_len], row_marks, None)
        if done:
            del self.ids[:done]
            del self.marks[:done]
