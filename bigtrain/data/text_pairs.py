"""Embedding data (``model.task: embedding``): records of an anchor, its positive and optional hard negatives
(``.jsonl``, a local HF dataset), the columns sentence-transformers trains on (``anchor``, ``positive``,
``negative``: one text, or a list of them, the same number in every record).

Every text is tokenised once with the model's tokenizer (its special tokens added), cut at ``data.seq_len`` (the
texts cut are counted and said) and kept in the data cache as one ragged file. A micro-batch of m examples is
``columns`` x m rows, right-padded to its longest with an attention mask, in blocks: the m anchors, their m positives,
then each column of negatives (``losses/contrastive.py`` reads them so).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigtrain.config.schema import DataConfig
from bigtrain.data import cache
from bigtrain.data.builtin import builtin_records
from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.data.records import check_records_path, read_records
from bigtrain.data.row_files import id_dtype, open_ragged
from bigtrain.data.text_classes import _encoder
from bigtrain.errors import ConfigError

ANCHOR, POSITIVE, NEGATIVE = "anchor", "positive", "negative"
BUILTIN_RETRIEVAL = "builtin:retrieval"  # questions and the built-in stories that answer them (data/builtin.py)
IDS, OFFSETS, CUT = "ids.bin", "offsets.bin", "cut.bin"


@dataclass(frozen=True)
class EmbeddingBatch:
    """m examples as ``columns`` x m right-padded rows (anchors, positives, each negatives' column) with their
    attention mask; per example a label that is 0, or IGNORE_INDEX for an evaluation filler (it counts nothing).
    ``cached``: what the step's pass before the forwards gives it (``roles/in_batch_negatives.CachedStep``)."""

    input_ids: torch.Tensor  # [columns x m, length]
    attention_mask: torch.Tensor  # [columns x m, length]
    labels: torch.Tensor  # [m] int64
    cached: Any = None

    @property
    def columns(self) -> int:
        return self.input_ids.shape[0] // self.labels.shape[0]

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}

    def tensors(self) -> list[torch.Tensor]:
        return [self.input_ids, self.attention_mask, self.labels]

    def to(self, device: torch.device) -> EmbeddingBatch:
        return EmbeddingBatch(*(t.to(device, non_blocking=True) for t in self.tensors()), self.cached)

    def pin_memory(self) -> EmbeddingBatch:
        return EmbeddingBatch(*(t.pin_memory() for t in self.tensors()), self.cached)

    def without_labels(self, rows: torch.Tensor) -> EmbeddingBatch:
        """The examples where ``rows`` ([m] bool) is set count nothing (evaluation fillers)."""
        return replace(self, labels=self.labels.masked_fill(rows, IGNORE_INDEX))

    def with_cached(self, cached: Any) -> EmbeddingBatch:
        return replace(self, cached=cached)


@dataclass
class TextPairs:
    """The examples' texts as token ids (``ids[e * columns + c]``: example e's column c), of which ``index`` says
    which are these (None: all, in order)."""

    ids: Any
    count: int
    columns: int
    pad_id: int
    vocab_size: int
    description: str
    index: np.ndarray | None = None
    was_cut: np.ndarray | None = None  # [examples x columns] bool: the text was longer than data.seq_len
    cache_note: str | None = None

    seq_len = 1  # one example per row of the loader's order
    positions = None

    @property
    def num_rows(self) -> int:
        return self.count if self.index is None else len(self.index)

    @property
    def examples(self) -> int:
        return self.num_rows

    @property
    def truncated(self) -> int:
        """Examples of this set (training or held out) with a text longer than seq_len, cut."""
        if self.was_cut is None:
            return 0
        cut = self.was_cut.reshape(self.count, self.columns).any(1)
        return int(cut.sum() if self.index is None else cut[self.index].sum())

    def at(self, rows: np.ndarray) -> np.ndarray:
        return rows if self.index is None else self.index[rows]

    def subset(self, index: np.ndarray, description: str, augment: bool = False) -> TextPairs:
        return replace(self, index=self.at(index), description=description)

    def micro_batch(self, rows: np.ndarray, seen: np.ndarray | None = None) -> EmbeddingBatch:
        at = self.at(rows)
        texts = [self.ids[e * self.columns + c] for c in range(self.columns) for e in at]
        longest = max(len(t) for t in texts)
        ids = torch.full((len(texts), longest), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(texts), longest), dtype=torch.int64)
        for k, t in enumerate(texts):
            ids[k, : len(t)] = torch.from_numpy(np.asarray(t, dtype=np.int64))
            mask[k, : len(t)] = 1
        return EmbeddingBatch(ids, mask, torch.zeros(len(at), dtype=torch.int64))


def load_text_pairs(cfg: DataConfig, key: str, path: str, tokenizer: str | None) -> TextPairs:
    """``path``'s records as embedding examples, tokenised by ``tokenizer`` (a folder, or None for bytes)."""
    if cfg.seq_len is None or cfg.seq_len < 2:
        raise ConfigError("data.seq_len is required for embedding models (the longest text kept, in tokens)")
    if path == BUILTIN_RETRIEVAL:
        records: Any = ((f"record {i}", r) for i, r in enumerate(builtin_records("retrieval", num_records=4000)))
    elif path.startswith("builtin:"):
        raise ConfigError(
            f"{key}={path!r} is not a built-in embedding set; use {BUILTIN_RETRIEVAL}, or records of anchor, "
            "positive[, negative] texts"
        )
    else:
        check_records_path(key, path)
        records = read_records(key, path, ANCHOR, cfg.split)
    parts = {
        "kind": "text pairs",
        "cut": "the tokenizer's truncation",  # (entries cut bare before it closed no text with its special token)
        "source": cache.source_identity(path),
        "tokenizer": cache.tokenizer_identity(tokenizer),
        **{name: getattr(cfg, name) for name in ("seq_len", "split")},
    }
    build = lambda out: _build(cfg, key, path, records, tokenizer, out)  # noqa: E731
    found = cache.entry(cache.cache_dir_of(cfg), "pairs", key, parts, build)
    meta, folder = found.meta, found.folder
    columns, count = meta["columns"], meta["examples"]
    was_cut = np.memmap(folder / CUT, dtype=np.bool_, mode="r", shape=(count * columns,))
    cut = int(was_cut.sum())
    said = f", {cut} text(s) cut at data.seq_len={cfg.seq_len}" if cut else ""
    negatives = f" and {columns - 2} negative(s)" if columns > 2 else ""
    where = f"{path} ({count} anchors with a positive{negatives} each{said}, {meta['which']})"
    ids = open_ragged(folder, IDS, OFFSETS, count * columns, meta["dtype"])
    return TextPairs(
        ids, count, columns, meta["pad"], meta["vocab"], where, was_cut=was_cut, cache_note=found.note(key)
    )


def _texts(key: str, path: str, where: str, record: dict[str, Any]) -> list[str]:
    """A record's texts in column order: its anchor, its positive, its negatives."""
    for field in (ANCHOR, POSITIVE):
        if not isinstance(record.get(field), str) or not record[field]:
            raise ConfigError(
                f"{key}={path!r}, {where}: no {field!r} text (an embedding example is an anchor, its positive and "
                f"optional negatives); it has {sorted(record)}"
            )
    negatives = record.get(NEGATIVE, [])
    negatives = [negatives] if isinstance(negatives, str) else list(negatives)
    if not all(isinstance(n, str) and n for n in negatives):
        raise ConfigError(f"{key}={path!r}, {where}: {NEGATIVE!r} must be a text or a list of texts")
    return [record[ANCHOR], record[POSITIVE], *negatives]


def _cutting_encoder(tokenizer: str | None, seq_len: int) -> Any:
    """encode(text) -> (ids of at most ``seq_len``, whether the text was cut), cut as sentence-transformers cuts
    (the tokenizer's truncation: a closing special token, BERT's [SEP] or a decoder's end-of-text, stays last, so
    the exported model embeds a cut text as training did); bytes are cut where they stop."""
    if tokenizer is None:
        from bigtrain.data.tokenizer import ByteTokenizer

        byte = ByteTokenizer()

        def encode_bytes(text: str) -> tuple[list[int], bool]:
            ids = byte.encode(text)
            return ids[:seq_len], len(ids) > seq_len

        return encode_bytes
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)

    def encode(text: str) -> tuple[list[int], bool]:
        ids = tok(text)["input_ids"]
        if len(ids) <= seq_len:
            return ids, False
        return tok(text, truncation=True, max_length=seq_len)["input_ids"], True

    return encode


def _build(cfg: DataConfig, key: str, path: str, records: Any, tokenizer: str | None, out: Path) -> dict[str, Any]:
    """Every record's texts tokenised (cut at data.seq_len) into one flat file in ``out``, column by column."""
    assert cfg.seq_len is not None
    _, pad, vocab, which = _encoder(tokenizer)
    encode = _cutting_encoder(tokenizer, cfg.seq_len)
    dtype = id_dtype(vocab - 1)
    lengths, cut_at, columns, count = [0], [], None, 0
    with (out / IDS).open("wb") as f:
        for where, record in cache.counted(records, key, "tokenising"):
            texts = _texts(key, path, where, record)
            if columns is not None and len(texts) != columns:
                raise ConfigError(
                    f"{key}={path!r}, {where}: {len(texts) - 2} negative(s) where the records before have "
                    f"{columns - 2}; every record needs the same number"
                )
            columns = len(texts)
            for text in texts:
                tokens, was_cut = encode(text)
                cut_at.append(was_cut)
                kept = np.asarray(tokens, dtype=dtype)
                f.write(kept.tobytes())
                lengths.append(len(kept))
            count += 1
    if not count:
        raise ConfigError(f"{key}={path!r} holds no records")
    np.cumsum(np.asarray(lengths, dtype=np.int64)).tofile(out / OFFSETS)
    np.asarray(cut_at, dtype=np.bool_).tofile(out / CUT)
    return {"examples": count, "columns": columns, "pad": pad, "vocab": vocab, "which": which, "dtype": dtype.str}
