"""Data sources: everything becomes token rows ``[num_sequences, seq_len]``, with what each row trains on.

A tokenised ``.npy`` is used as it is (memory-mapped): every next token is a target. Records (``.jsonl``, ``.txt``,
local HF datasets, built-in) are tokenised by format (data/formats.py: text, chat, instruction) and packed into rows
(data/packing.py: stream, documents, pad).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import chain

import numpy as np
import torch

from bigtrain.config.schema import DataConfig
from bigtrain.data.batch import MicroBatch
from bigtrain.data.builtin import builtin_records
from bigtrain.data.formats import detect_format, examples
from bigtrain.data.labels import masked_next_token_labels, next_token_labels
from bigtrain.data.packing import pack
from bigtrain.data.records import Record, check_records_path, describe_sources, is_glob, read_records
from bigtrain.data.tokenizer import load_tokenizer
from bigtrain.errors import ConfigError

BUILTIN_PREFIX = "builtin:"


@dataclass
class TokenRows:
    """Token rows plus what they train on and what they were made with (for vocabulary checks and logs)."""

    rows: np.ndarray  # [num_sequences, seq_len], integer ids (a .npy stays memory-mapped)
    vocab_size: int | None  # tokenizer vocabulary, None for pre-tokenised .npy
    description: str
    targets: np.ndarray | None = None  # [num_sequences, seq_len] bool, which tokens are predicted; None: all
    positions: np.ndarray | None = None  # [num_sequences, seq_len] position ids restarting per packed document
    index: np.ndarray | None = None  # the rows of ``rows`` these are (a split of them), in order; None: all
    truncated: int = 0  # records longer than seq_len, cut (packing documents or pad)
    examples: int = 0  # records read (0 for a tokenised .npy)

    @property
    def seq_len(self) -> int:
        return int(self.rows.shape[1])

    @property
    def num_rows(self) -> int:
        return len(self.rows) if self.index is None else len(self.index)

    def micro_batch(self, rows: np.ndarray, seen: np.ndarray | None = None) -> MicroBatch:
        """Rows ``rows`` (0-based among these) as a host micro-batch with their labels (and position ids when
        documents are packed); ``seen`` (where the rows sit in the global order) changes nothing in token rows."""
        at = rows if self.index is None else self.index[rows]
        ids = torch.from_numpy(np.asarray(self.rows[at], dtype=np.int64))
        labels = next_token_labels(ids) if self.targets is None else masked_next_token_labels(ids, self.targets[at])
        pos = None if self.positions is None else torch.from_numpy(np.asarray(self.positions[at], dtype=np.int64))
        return MicroBatch(ids, labels, pos)


def held_out_rows(num_rows: int, fraction: float, seed: int, noun: str = "rows") -> tuple[np.ndarray, np.ndarray]:
    """``data.eval_fraction``: (the rows kept for training, the seeded choice held out), each in order."""
    count = max(1, round(fraction * num_rows))
    if count >= num_rows:
        raise ConfigError(
            f"data.eval_fraction={fraction} of {num_rows} {noun} leaves none to train on; use a smaller fraction"
        )
    held = np.sort(np.random.default_rng(seed).choice(num_rows, size=count, replace=False))
    return np.setdiff1d(np.arange(num_rows), held), held


def hold_out(data: TokenRows, fraction: float, seed: int) -> tuple[TokenRows, TokenRows]:
    """``data.eval_fraction`` of token rows: held-out rows for evaluation, the rest for training (both in file order,
    without copying a memory-mapped file)."""
    kept, held = held_out_rows(data.num_rows, fraction, seed)
    train = replace(data, description=f"{data.description}, {len(kept)} for training", index=kept)
    return train, replace(data, description=f"{len(held)} held-out rows", index=held)


def check_data_config(cfg: DataConfig, key: str = "data.path", path: str | None = None) -> None:
    """Fail early, on every rank, for a data path that cannot work."""
    path = cfg.path if path is None else path
    if path.startswith(BUILTIN_PREFIX):
        builtin_records(path.removeprefix(BUILTIN_PREFIX), num_records=0)
    else:
        check_records_path(key, path)
    is_npy = path.endswith(".npy") and not is_glob(path)
    if not is_npy and cfg.seq_len is None:
        raise ConfigError("data.seq_len is required for text, chat and instruction data; e.g. data.seq_len=128")
    if is_npy and cfg.format not in ("auto", "text"):
        raise ConfigError(f"{key}={path!r} is tokenised already; data.format={cfg.format} applies to records only")
    if cfg.seq_len is not None and cfg.seq_len < 2:
        raise ConfigError(f"data.seq_len={cfg.seq_len} must be at least 2 (one input and one predicted token)")


def load_token_rows(cfg: DataConfig, key: str = "data.path", path: str | None = None) -> TokenRows:
    """``data.path`` (or another path of the same recipe, e.g. ``data.eval_path``) as token rows."""
    path = cfg.path if path is None else path
    check_data_config(cfg, key, path)
    if path.endswith(".npy") and not is_glob(path):
        return _load_npy(cfg, key, path)
    tokenizer = load_tokenizer(cfg.tokenizer)
    records: Iterable[Record]
    if path.startswith(BUILTIN_PREFIX):
        built = builtin_records(path.removeprefix(BUILTIN_PREFIX))
        text = cfg.text_field  # the stories' text goes where the recipe reads text from
        records = ((f"record {i}", {text: r["text"]} if "text" in r else r) for i, r in enumerate(built))
    else:
        records = read_records(key, path, cfg.text_field, cfg.split)
    first = next(iter(records), None)
    if first is None:
        raise ConfigError(f"{key}={path!r} holds no records; give {describe_sources()}")
    fmt = detect_format(first[1]) if cfg.format == "auto" else cfg.format
    mode = cfg.packing or ("stream" if fmt == "text" else "documents")
    assert cfg.seq_len is not None
    packed = pack(
        examples(chain([first], records), fmt, tokenizer, cfg.text_field, key), cfg.seq_len, mode, tokenizer.eos_id
    )
    num_rows = len(packed.rows)
    if num_rows == 0:
        raise ConfigError(
            f"{key}={path!r} gives fewer tokens than one sequence of data.seq_len={cfg.seq_len}; "
            "use more data or a shorter data.seq_len"
        )
    if packed.targets is not None and not packed.targets[:, 1:].any():
        raise ConfigError(
            f"{key}={path!r}: no {fmt} example has a token to train on within data.seq_len={cfg.seq_len} (chat: no "
            "assistant turn; instruction: empty completions, or prompts longer than seq_len); check the data or "
            "raise data.seq_len"
        )
    which = f"tokenizer {cfg.tokenizer}" if cfg.tokenizer else "the built-in byte tokenizer (257 ids)"
    cut = f", {packed.truncated} truncated to seq_len" if packed.truncated else ""
    rows = f"{num_rows} {mode}-packed rows of {cfg.seq_len}{cut}"
    description = f"{path} ({fmt}: {packed.examples} examples, {rows}, {which})"
    return TokenRows(
        packed.rows,
        tokenizer.vocab_size,
        description,
        packed.targets,
        packed.positions,
        truncated=packed.truncated,
        examples=packed.examples,
    )


def _load_npy(cfg: DataConfig, key: str, path: str) -> TokenRows:
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":  # np.load would take anything else for a pickle and say so
        raise ConfigError(
            f"{key}={path!r} is not a NumPy .npy file (no .npy header); write token rows with "
            "numpy.save(path, ids) where ids is an integer array [num_sequences, seq_len]"
        )
    try:
        rows = np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as e:
        raise ConfigError(f"{key}={path!r} is a damaged or truncated .npy file ({e}); write it again") from e
    if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.integer):
        raise ConfigError(
            f"{key}={path!r} holds {rows.dtype} of shape {tuple(rows.shape)}; "
            "a tokenised .npy must be integer ids of shape [num_sequences, seq_len]"
        )
    if rows.shape[0] == 0 or rows.shape[1] < 2:
        raise ConfigError(
            f"{key}={path!r} has shape {tuple(rows.shape)}: it needs at least one row of at least 2 tokens "
            "(one input and one predicted token)"
        )
    if cfg.seq_len is not None and cfg.seq_len != rows.shape[1]:
        raise ConfigError(
            f"data.seq_len={cfg.seq_len} does not match the width {rows.shape[1]} of {path}; "
            f"set data.seq_len={rows.shape[1]} or leave it unset"
        )
    return TokenRows(rows, None, f"{path} ({rows.shape[0]} rows of {rows.shape[1]})")


CHECK_CHUNK_ROWS = 1 << 16  # rows scanned at a time: bounded memory for any file size


def check_vocabulary(data: TokenRows, vocab_size: int, data_path: str, key: str = "data.path") -> None:
    """Every token id must index the model's embedding: checked once, before training, on every rank.

    Text was tokenised by a tokenizer of known size; a tokenised .npy is scanned whole (memory-mapped, a chunk of
    rows at a time), so a bad id fails now rather than when its batch comes up, hours into a run.
    """
    if data.vocab_size is not None:
        if data.vocab_size > vocab_size:
            raise ConfigError(
                f"the tokenizer has {data.vocab_size} ids but the model's vocab_size is {vocab_size}; "
                f"set model.config.vocab_size >= {data.vocab_size} or use a matching data.tokenizer"
            )
        return
    rows = data.rows
    for start in range(0, rows.shape[0], CHECK_CHUNK_ROWS):
        block = np.asarray(rows[start : start + CHECK_CHUNK_ROWS])
        bad = (block < 0) | (block >= vocab_size)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise ConfigError(
                f"{key}={data_path!r} has token id {int(block[row, col])} (row {start + int(row)}, position "
                f"{int(col)}) outside the model's vocabulary of {vocab_size}; use a tokenizer that matches the "
                "model or a larger vocab_size"
            )
