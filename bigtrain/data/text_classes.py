"""Sequence classification data: records (``.jsonl``, a local HF dataset, or ``builtin:story-animals``) with a text
(``data.text_field``), optionally a second text (``text_pair``), and a label (``data.label_field``), tokenised once
with the model's tokenizer (its special tokens added, as the classifier was trained with), cut at ``data.seq_len``
and padded per micro-batch to its longest example, with the attention mask that hides the padding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigtrain.config.schema import DataConfig
from bigtrain.data import cache
from bigtrain.data.batch import ExampleBatch
from bigtrain.data.builtin import ANIMALS, builtin_records
from bigtrain.data.examples import IndexedExamples, label_indices
from bigtrain.data.records import check_records_path, read_records
from bigtrain.data.row_files import id_dtype, open_ragged
from bigtrain.data.tokenizer import ByteTokenizer, has_tokenizer
from bigtrain.errors import ConfigError

BUILTIN_STORY_ANIMALS = "builtin:story-animals"
TEXT_PAIR_FIELD = "text_pair"


@dataclass
class TextExamples(IndexedExamples):
    ids: Any  # each example's token ids, cut at seq_len (``ids[i]``: data/row_files.Ragged, mapped)
    labels: np.ndarray  # [num_examples] int64
    class_names: list[str]
    pad_id: int
    vocab_size: int
    description: str
    index: np.ndarray | None = None
    was_cut: np.ndarray | None = None  # [num_examples] bool: the example was longer than seq_len
    cache_note: str | None = None  # where in the data cache, and whether this start built it

    @property
    def truncated(self) -> int:
        """Examples of this set (training or held out) longer than seq_len, cut."""
        if self.was_cut is None:
            return 0
        return int(self.was_cut.sum() if self.index is None else self.was_cut[self.index].sum())

    def subset(self, index: np.ndarray, description: str, augment: bool) -> TextExamples:
        """``augment``: images only (texts are not augmented)."""
        return replace(self, index=self.at(index), description=description)

    def micro_batch(self, rows: np.ndarray, seen: np.ndarray | None = None) -> ExampleBatch:
        at = self.at(rows)
        longest = max(len(self.ids[i]) for i in at)
        ids = torch.full((len(at), longest), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(at), longest), dtype=torch.int64)
        for k, i in enumerate(at):
            ids[k, : len(self.ids[i])] = torch.from_numpy(self.ids[i])
            mask[k, : len(self.ids[i])] = 1
        labels = torch.from_numpy(self.labels[at].astype(np.int64))
        return ExampleBatch({"input_ids": ids, "attention_mask": mask}, labels)


def _encoder(tokenizer_folder: str | None) -> tuple[Callable[[str, str | None], list[int]], int, int, str]:
    """(encode(text, pair), pad id, vocabulary size, what it is) of the recipe's tokenizer, else the byte tokenizer."""
    if tokenizer_folder is None:
        byte = ByteTokenizer()

        def encode_bytes(text: str, pair: str | None) -> list[int]:
            return byte.encode(text if pair is None else f"{text}\n{pair}")

        return encode_bytes, byte.eos_id, byte.vocab_size, "the built-in byte tokenizer (257 ids)"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_folder, local_files_only=True)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    def encode(text: str, pair: str | None) -> list[int]:
        return tok(text, pair, add_special_tokens=True)["input_ids"]

    return encode, int(pad), len(tok), f"tokenizer {tokenizer_folder}"


def tokenizer_folder(cfg: DataConfig, model_folder: str | None) -> str | None:
    """data.tokenizer, else the model folder when it ships a tokenizer, else None (bytes)."""
    if cfg.tokenizer is not None:
        return cfg.tokenizer
    if model_folder is not None and has_tokenizer(Path(model_folder)):
        return model_folder
    return None


def load_text_examples(cfg: DataConfig, key: str, path: str, tokenizer: str | None) -> TextExamples:
    """``path`` as classification examples, tokenised by ``tokenizer`` (a folder, or None for bytes)."""
    if cfg.seq_len is None or cfg.seq_len < 2:
        raise ConfigError("data.seq_len is required for sequence classification (the longest example kept, in tokens)")
    if path == BUILTIN_STORY_ANIMALS:
        stories = builtin_records("stories", num_records=4000)
        records: Any = (
            (f"record {i}", {cfg.text_field: r["text"], cfg.label_field: _animal(r["text"])})
            for i, r in enumerate(stories)
        )
    elif path.startswith("builtin:"):
        raise ConfigError(f"{key}={path!r} is not a built-in classification set; use {BUILTIN_STORY_ANIMALS}")
    else:
        check_records_path(key, path)
        records = read_records(key, path, cfg.text_field, cfg.split)
    parts = {
        "kind": "text examples",
        "source": cache.source_identity(path),
        "tokenizer": cache.tokenizer_identity(tokenizer),
        **{name: getattr(cfg, name) for name in ("seq_len", "text_field", "label_field", "split")},
    }
    build = lambda out: _build(cfg, key, path, records, tokenizer, out)  # noqa: E731
    found = cache.entry(cache.cache_dir_of(cfg), "texts", key, parts, build)
    meta, folder = found.meta, found.folder
    n = meta["examples"]
    was_cut = np.memmap(folder / CUT, dtype=np.bool_, mode="r", shape=(n,))
    labels = np.memmap(folder / LABELS, dtype=np.int64, mode="r", shape=(n,))
    cut = f", {int(was_cut.sum())} cut at data.seq_len={cfg.seq_len}" if was_cut.any() else ""
    where = f"{path} ({n} examples, {len(meta['classes'])} classes{cut}, {meta['which']})"
    return TextExamples(
        open_ragged(folder, IDS, OFFSETS, n, meta["dtype"]), labels, list(meta["classes"]), meta["pad"], meta["vocab"],
        where, was_cut=was_cut, cache_note=found.note(key),
    )  # fmt: skip


IDS, OFFSETS, LABELS, CUT = "ids.bin", "offsets.bin", "labels.bin", "cut.bin"


def _build(cfg: DataConfig, key: str, path: str, records: Any, tokenizer: str | None, out: Path) -> dict[str, Any]:
    """The records tokenised (cut at data.seq_len) into flat files in ``out``; the labels as class indices."""
    assert cfg.seq_len is not None
    encode, pad, vocab, which = _encoder(tokenizer)
    dtype = id_dtype(vocab - 1)
    lengths, raw, cut_at = [0], [], []
    with (out / IDS).open("wb") as f:
        for where, record in cache.counted(records, key, "tokenising"):
            for field in (cfg.text_field, cfg.label_field):
                if field not in record:
                    raise ConfigError(f"{key}={path!r}, {where}: no {field!r} field; it has {sorted(record)}")
            tokens = encode(str(record[cfg.text_field]), record.get(TEXT_PAIR_FIELD))
            cut_at.append(len(tokens) > cfg.seq_len)
            kept = np.asarray(tokens[: cfg.seq_len], dtype=dtype)
            f.write(kept.tobytes())
            lengths.append(len(kept))
            raw.append(record[cfg.label_field])
    if not raw:
        raise ConfigError(f"{key}={path!r} holds no records")
    classes, labels = label_indices(raw, key, cfg.label_field)
    np.cumsum(np.asarray(lengths, dtype=np.int64)).tofile(out / OFFSETS)
    np.asarray(labels, dtype=np.int64).tofile(out / LABELS)
    np.asarray(cut_at, dtype=np.bool_).tofile(out / CUT)
    return {"examples": len(raw), "classes": classes, "pad": pad, "vocab": vocab, "which": which, "dtype": dtype.str}


def _animal(text: str) -> str:
    """The label of a built-in story: the animal it is about ("... a {colour} {animal} named ...")."""
    return next(a for a in ANIMALS if f" {a} named" in text)
