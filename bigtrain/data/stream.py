"""``data.streaming``: a HF dataset read as a stream, tokenised and packed as training goes, for a corpus that is not
on local disk in full.

Row p of the global order is the p-th row the stream's records pack into (the stream's own order, epoch after
epoch: the packing carries on across the end of an epoch). Every rank reads the whole stream and keeps the rows of
its own share of each step, so the rows of a step are the same at any world size and plan, as with indexed data
(data/order.py); a rank holds at most a step's rows.

The position in the stream is saved in each checkpoint: a mark (the HF dataset's ``state_dict`` and the packer's
unfinished row) taken before the first record read after each finished row, the last one before the next step's
first row. A resume opens the stream there (datasets skips to the shard and record) and reads on, dropping the
rows before the step's: at most a row's worth of records is tokenised again.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bigtrain.config.schema import DataConfig
from bigtrain.data import cache
from bigtrain.data.batch import MicroBatch
from bigtrain.data.formats import detect_format, examples
from bigtrain.data.packing import Packer, layout
from bigtrain.data.records import is_glob, open_stream
from bigtrain.data.rows import TokenRows
from bigtrain.data.tokenizer import load_tokenizer
from bigtrain.errors import ConfigError

ENDLESS = 1 << 62  # the rows of a stream, for the global order: it never ends (its epochs follow one another)


@dataclass
class Mark:
    """Where the stream stood before one record: enough to go on from there exactly."""

    next_row: int  # the position of the first row still to come
    epoch: int
    record: int  # the record's index in its epoch (names a bad record)
    dataset: dict[str, Any]  # the HF dataset's state_dict
    carry: dict[str, Any]  # the packer's unfinished row


class StreamedRows:
    """Token rows of a streamed source, read by global position (``micro_batch`` takes positions, not indices)."""

    self_ordered = True  # the stream's order is the global order: the loader does not shuffle it
    streamed = True
    index = None
    truncated = 0
    examples = 0
    cache_note = None

    def __init__(self, cfg: DataConfig, key: str, path: str) -> None:
        assert cfg.seq_len is not None
        self.key, self.path, self.split, self.text_field = key, path, cfg.split, cfg.text_field
        self.tokenizer = load_tokenizer(cfg.tokenizer)
        self.vocab_size: int | None = self.tokenizer.vocab_size
        first = next(iter(open_stream(key, path, cfg.split)), None)
        if first is None:
            raise ConfigError(f"{key}={path!r} holds no records (data.streaming)")
        self.format = detect_format(first) if cfg.format == "auto" else cfg.format
        self.mode = cfg.packing or ("stream" if self.format == "text" else "documents")
        self.seq_len = cfg.seq_len
        self.padded = self.mode == "pad"
        self.with_targets, self.with_positions = layout(self.mode, masked=self.format != "text")
        which = f"tokenizer {cfg.tokenizer}" if cfg.tokenizer else "the built-in byte tokenizer (257 ids)"
        self.description = (
            f"{path} (streamed: {self.format}, {self.mode}-packed rows of {self.seq_len} made as training goes, in "
            f"the stream's order; {which})"
        )
        self._identity = self._source_identity(cache.tokenizer_identity(cfg.tokenizer))
        self._open(None)

    @property
    def num_rows(self) -> int:
        return ENDLESS

    @property
    def packed_documents(self) -> bool:
        return self.with_positions

    def identity(self) -> dict[str, Any]:
        """What a saved position belongs to (found once, at the start: the files this run reads)."""
        return self._identity

    def _source_identity(self, tokenizer_files: str | None) -> dict[str, Any]:
        """Other files (a shard added, one rewritten), another tokenizer, format or packing make a saved position
        meaningless (a dataset streamed by name is known by its name and split)."""
        local = is_glob(self.path) or Path(self.path).exists()
        files = cache.source_identity(self.path) if local else None
        digest = hashlib.sha256(json.dumps([files, tokenizer_files]).encode()).hexdigest()[:20]
        return {"path": self.path, "split": self.split, "format": self.format, "mode": self.mode,
                "seq_len": self.seq_len, "text_field": self.text_field, "files_and_tokenizer": digest}  # fmt: skip

    # -- reading -------------------------------------------------------------------------------------------------

    def micro_batch(self, rows: np.ndarray, seen: np.ndarray | None = None) -> MicroBatch:
        """The rows at global positions ``rows`` (increasing from one call to the next, as a rank's micro-batches
        of successive steps are)."""
        low, high = int(rows.min()), int(rows.max())
        if low < self._first:  # an earlier position than the rows kept: go back to the last mark before it
            self._open(self._mark_at(low))
        self._advance(high + 1, keep_from=low)
        kept = [self._rows[int(p) - self._first] for p in np.asarray(rows).reshape(-1)]
        ids = np.stack([r[0] for r in kept]).astype(np.int64)
        targets = np.stack([r[1] for r in kept]) if self.with_targets else None
        positions = np.stack([r[2] for r in kept]).astype(np.int64) if self.with_positions else None
        block = TokenRows(ids, self.vocab_size, self.description, targets, positions)
        return block.micro_batch(np.arange(len(kept)))

    # -- the position in a checkpoint ---------------------------------------------------------------------------

    def state_at(self, position: int) -> str:
        """The stream's position for reading on from row ``position`` (the first row of the next step), as text
        for the checkpoint."""
        if position < self._first:
            self._open(self._mark_at(position))
        # the record that finishes row ``position`` is read: the last mark before it is the one
        self._advance(position + 1, keep_from=position)
        mark = self._mark_at(position)
        return json.dumps({"position": position, "source": self.identity(), "mark": asdict(mark)})

    def restore(self, saved: str, position: int) -> tuple[bool, str]:
        """Go on from a checkpoint's position (``state_at``'s text), whose next row is ``position``: whether it
        applies, and the line that says where the stream goes on."""
        state = json.loads(saved)
        mark = Mark(**state["mark"])
        if state["source"] != self.identity() or mark.next_row > position:
            self._open(None)
            why = "other data" if state["source"] != self.identity() else f"row {state['position']}"
            return False, (
                f"the checkpoint's stream position is for {why}, not this recipe's data at row {position}: the "
                f"stream is read from its start up to row {position}"
            )
        self._open(mark)  # a mark before the position (another global batch size) reads on to it
        return True, f"{self.key}: the stream goes on at row {position} (epoch {self._epoch}, record {self._record})"

    # -- the stream ----------------------------------------------------------------------------------------------

    def _open(self, mark: Mark | None) -> None:
        """Read from ``mark`` (None: the stream's start)."""
        self._dataset = open_stream(self.key, self.path, self.split)
        if mark is not None:
            self._dataset.load_state_dict(mark.dataset)
        # a loaded state_dict reads back as the start until the first record is taken: until then, the mark's own
        self._loaded = None if mark is None else mark.dataset
        self._records: Iterator[dict[str, Any]] = iter(self._dataset)
        self._packer = Packer(self.seq_len, self.mode, self.tokenizer.eos_id, self)
        if mark is not None:
            self._packer.restore(mark.carry)
        self._epoch = 0 if mark is None else mark.epoch
        self._record = 0 if mark is None else mark.record
        self._made = 0 if mark is None else mark.next_row  # rows finished so far (the next one's position)
        self._first = self._made  # the position of self._rows[0]
        self._rows: list[tuple[np.ndarray, Any, Any]] = []
        self._marks: list[Mark] = []

    def add(self, ids: list[int], targets: list[bool] | None, positions: list[int] | None) -> None:
        """The packer's finished row (this object is its sink), kept as arrays (a list of ints is 7x larger)."""
        row = np.asarray(ids, dtype=np.int32)
        marks = None if targets is None else np.asarray(targets, dtype=bool)
        self._rows.append((row, marks, None if positions is None else np.asarray(positions, dtype=np.int32)))
        self._made += 1

    def _advance(self, end: int, keep_from: int) -> None:
        """Read records until rows up to position ``end`` (excluded) are made, forgetting those before
        ``keep_from`` as they come (a stream read from its start to a far position holds a row or so)."""
        while self._made < end:
            if self._made <= keep_from:
                self._drop_below(min(keep_from, self._made))
            if not self._marks or self._marks[-1].next_row != self._made:  # one mark per row made is enough
                state = self._loaded if self._loaded is not None else self._dataset.state_dict()
                self._marks.append(Mark(self._made, self._epoch, self._record, state, self._packer.carry()))
            record = next(self._records, None)
            self._loaded = None
            if record is None:  # the end of an epoch: the stream starts again (the packing goes on)
                if self._record == 0:
                    raise ConfigError(f"{self.key}={self.path!r} holds no records (data.streaming)")
                self._marks.pop()
                self._dataset = open_stream(self.key, self.path, self.split)
                self._records = iter(self._dataset)
                self._epoch, self._record = self._epoch + 1, 0
                continue
            where = f"record {self._record}" + (f" of epoch {self._epoch}" if self._epoch else "")
            for example in examples([(where, record)], self.format, self.tokenizer, self.text_field, self.key):
                self._packer.add(example)
            self._record += 1
        self._drop_below(keep_from)

    def _mark_at(self, position: int) -> Mark | None:
        """The last mark from which row ``position`` is still to come (None: only the stream's start)."""
        after = bisect.bisect_right(self._marks, position, key=lambda m: m.next_row)
        return self._marks[after - 1] if after else None

    def _drop_below(self, position: int) -> None:
        """Forget rows before ``position`` and every mark but the last one before it (positions only grow)."""
        if position > self._first:
            del self._rows[: position - self._first]
            self._first = position
        after = bisect.bisect_right(self._marks, position, key=lambda m: m.next_row)  # marks grow in next_row
        if after > 1:
            del self._marks[: after - 1]
