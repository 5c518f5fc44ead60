"""Data sources: everything becomes a 2-D array of token rows ``[num_sequences, seq_len]``.

A tokenised ``.npy`` is used as it is (memory-mapped). Text (``.jsonl``, ``.txt``, built-in) is tokenised, each document
followed by the end-of-document id, concatenated and cut into rows of ``seq_len`` (packing); the ragged tail is dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bigtrain.config.schema import DataConfig
from bigtrain.data.builtin import builtin_documents
from bigtrain.data.tokenizer import load_tokenizer
from bigtrain.errors import ConfigError

BUILTIN_PREFIX = "builtin:"
TEXT_SUFFIXES = (".jsonl", ".txt")


@dataclass
class TokenRows:
    """Token rows plus what they were made with (for vocabulary checks and logs)."""

    rows: np.ndarray  # [num_sequences, seq_len], integer ids
    vocab_size: int | None  # tokenizer vocabulary, None for pre-tokenised .npy
    description: str

    @property
    def seq_len(self) -> int:
        return int(self.rows.shape[1])


def check_data_config(cfg: DataConfig) -> None:
    """Fail early, on every rank, for a data path that cannot work."""
    if cfg.path.startswith(BUILTIN_PREFIX):
        builtin_documents(cfg.path.removeprefix(BUILTIN_PREFIX), num_documents=0)
        if cfg.seq_len is None:
            raise ConfigError("data.seq_len is required for text data; e.g. data.seq_len=128")
        return
    path = Path(cfg.path)
    if path.is_dir():
        raise ConfigError(
            f"data.path={cfg.path!r} is a directory; give a .npy, .jsonl or .txt file in it, or builtin:stories"
        )
    if not path.is_file():
        raise ConfigError(
            f"data.path={cfg.path!r} does not exist; give a .npy, .jsonl or .txt file, or builtin:stories"
        )
    if path.suffix not in (".npy", *TEXT_SUFFIXES):
        raise ConfigError(f"data.path={cfg.path!r} has suffix {path.suffix!r}; use .npy, .jsonl or .txt")
    if path.suffix in TEXT_SUFFIXES and cfg.seq_len is None:
        raise ConfigError("data.seq_len is required for text data; e.g. data.seq_len=128")
    if cfg.seq_len is not None and cfg.seq_len < 2:
        raise ConfigError(f"data.seq_len={cfg.seq_len} must be at least 2 (one input and one predicted token)")


def load_token_rows(cfg: DataConfig) -> TokenRows:
    check_data_config(cfg)
    if cfg.path.endswith(".npy"):
        return _load_npy(cfg)
    tokenizer = load_tokenizer(cfg.tokenizer)
    if cfg.path.startswith(BUILTIN_PREFIX):
        docs = builtin_documents(cfg.path.removeprefix(BUILTIN_PREFIX))
    else:
        docs = _read_text_documents(Path(cfg.path), cfg.text_field)
    assert cfg.seq_len is not None
    ids: list[int] = []
    for doc in docs:
        ids.extend(tokenizer.encode(doc))
        ids.append(tokenizer.eos_id)
    num_rows = len(ids) // cfg.seq_len
    if num_rows == 0:
        raise ConfigError(
            f"data.path={cfg.path!r} has {len(ids)} tokens, fewer than one sequence of data.seq_len={cfg.seq_len}; "
            "use more text or a shorter data.seq_len"
        )
    rows = np.asarray(ids[: num_rows * cfg.seq_len], dtype=np.int64).reshape(num_rows, cfg.seq_len)
    which = f"tokenizer {cfg.tokenizer}" if cfg.tokenizer else "the built-in byte tokenizer (257 ids)"
    return TokenRows(rows, tokenizer.vocab_size, f"{cfg.path} ({num_rows} packed rows of {cfg.seq_len}, {which})")


def _load_npy(cfg: DataConfig) -> TokenRows:
    with open(cfg.path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":  # np.load would take anything else for a pickle and say so
        raise ConfigError(
            f"data.path={cfg.path!r} is not a NumPy .npy file (no .npy header); write token rows with "
            "numpy.save(path, ids) where ids is an integer array [num_sequences, seq_len]"
        )
    try:
        rows = np.load(cfg.path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as e:
        raise ConfigError(f"data.path={cfg.path!r} is a damaged or truncated .npy file ({e}); write it again") from e
    if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.integer):
        raise ConfigError(
            f"data.path={cfg.path!r} holds {rows.dtype} of shape {tuple(rows.shape)}; "
            "a tokenised .npy must be integer ids of shape [num_sequences, seq_len]"
        )
    if rows.shape[0] == 0 or rows.shape[1] < 2:
        raise ConfigError(
            f"data.path={cfg.path!r} has shape {tuple(rows.shape)}: it needs at least one row of at least 2 tokens "
            "(one input and one predicted token)"
        )
    if cfg.seq_len is not None and cfg.seq_len != rows.shape[1]:
        raise ConfigError(
            f"data.seq_len={cfg.seq_len} does not match the width {rows.shape[1]} of {cfg.path}; "
            f"set data.seq_len={rows.shape[1]} or leave it unset"
        )
    return TokenRows(rows, None, f"{cfg.path} ({rows.shape[0]} rows of {rows.shape[1]})")


def _read_text_documents(path: Path, text_field: str) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"data.path={str(path)!r} is not UTF-8 text (byte {e.start}, line {line}); convert it, e.g. "
            "iconv -f latin1 -t utf-8"
        ) from e
    if path.suffix == ".txt":
        return [text]
    docs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"data.path={str(path)!r} line {lineno} is not JSON ({e.msg})") from e
        if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
            raise ConfigError(
                f"data.path={str(path)!r} line {lineno} has no string field {text_field!r}; "
                "set data.text_field to the field that holds the text"
            )
        docs.append(obj[text_field])
    return docs


CHECK_CHUNK_ROWS = 1 << 16  # rows scanned at a time: bounded memory for any file size


def check_vocabulary(data: TokenRows, vocab_size: int, data_path: str) -> None:
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
                f"data.path={data_path!r} has token id {int(block[row, col])} (row {start + int(row)}, position "
                f"{int(col)}) outside the model's vocabulary of {vocab_size}; use a tokenizer that matches the "
                "model or a larger vocab_size"
            )
