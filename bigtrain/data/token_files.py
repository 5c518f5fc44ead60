"""Pre-tokenised corpora, mapped as they are (no copy, any size): a tokenised ``.npy`` of rows, a flat token file
(``.bin`` without an ``.idx`` beside it: every document's ids one after another, as nanoGPT's ``prepare.py`` writes
them, of ``data.token_dtype``) and Megatron's indexed dataset (a ``.bin`` and the ``.idx`` beside it: the ids and
each document's length and offset, its dtype in the index).

A flat file and a Megatron pair stream-packed are the file cut into rows of ``data.seq_len`` (the ragged tail
dropped): a reshaped view of the mapped file. A Megatron pair packed as ``documents`` knows where its documents
start, so its rows are built once into the data cache as records' are (whole documents per row, positions
restarting per document).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bigtrain.errors import ConfigError

MEGATRON_HEADER = b"MMIDIDX\x00\x00"
# Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py, DType)
MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
                   8: np.uint16}  # fmt: skip
TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64")


def is_token_file(path: str) -> bool:
    return path.endswith(".bin")


def index_of(path: str) -> Path:
    """Where a ``.bin``'s Megatron index would be."""
    return Path(path).with_suffix(".idx")


@dataclass(frozen=True)
class MegatronIndex:
    """What a Megatron ``.idx`` says of its ``.bin``."""

    dtype: np.dtype
    lengths: np.ndarray  # [sequences] int32: tokens of each sequence (a document here)
    pointers: np.ndarray  # [sequences] int64: byte offset of each in the .bin

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))


def read_megatron_index(key: str, path: Path) -> MegatronIndex:
    """The index, its arrays mapped (an index of millions of documents is not read whole)."""
    with path.open("rb") as f:
        head = f.read(len(MEGATRON_HEADER) + 8 + 1 + 8 + 8)
    if not head.startswith(MEGATRON_HEADER) or len(head) < len(MEGATRON_HEADER) + 25:
        raise ConfigError(
            f"{key}: {path} is not a Megatron index (no MMIDIDX header); a .bin with an .idx beside it must be "
            "Megatron's indexed dataset (tools/preprocess_data.py), a .bin alone a flat token file"
        )
    version, code, sequences, _documents = struct.unpack("<QBQQ", head[len(MEGATRON_HEADER) :])
    if version != 1 or code not in MEGATRON_DTYPES:
        raise ConfigError(f"{key}: {path} is a Megatron index of version {version}, dtype code {code}: not readable")
    dtype = np.dtype(MEGATRON_DTYPES[code])
    if not np.issubdtype(dtype, np.integer):
        raise ConfigError(f"{key}: {path} indexes {dtype} values; token ids are integers")
    offset = len(head)
    lengths = np.memmap(path, dtype=np.int32, mode="r", offset=offset, shape=(sequences,))
    pointers = np.memmap(path, dtype=np.int64, mode="r", offset=offset + 4 * sequences, shape=(sequences,))
    return MegatronIndex(dtype, lengths, pointers)


def token_stream(key: str, path: str, token_dtype: str) -> np.ndarray:
    """Every id of the ``.bin`` in order, mapped: its dtype from the Megatron index beside it, else ``token_dtype``."""
    idx = index_of(path)
    dtype = read_megatron_index(key, idx).dtype if idx.is_file() else np.dtype(token_dtype)
    size = Path(path).stat().st_size
    if size % dtype.itemsize:
        raise ConfigError(
            f"{key}={path!r} has {size} bytes, not a whole number of {dtype} ids; set data.token_dtype to the dtype "
            f"it was written with (one of {', '.join(TOKEN_DTYPES)})"
        )
    if size == 0:
        raise ConfigError(f"{key}={path!r} is empty")
    return np.memmap(path, dtype=dtype, mode="r")


def stream_rows(key: str, path: str, token_dtype: str, seq_len: int) -> np.ndarray:
    """The file cut into rows of ``seq_len`` (a view: nothing is copied)."""
    ids = token_stream(key, path, token_dtype)
    rows = len(ids) // seq_len
    if rows == 0:
        raise ConfigError(
            f"{key}={path!r} holds {len(ids)} tokens, fewer than one row of data.seq_len={seq_len}; use a shorter "
            "data.seq_len"
        )
    return ids[: rows * seq_len].reshape(rows, seq_len)


def documents(key: str, path: str) -> Iterator[list[int]]:
    """A Megatron pair's documents in order (each sequence of its index), read one at a time."""
    index = read_megatron_index(key, index_of(path))
    ids = token_stream(key, path, str(index.dtype))
    item = index.dtype.itemsize
    for start, length in zip(index.pointers, index.lengths, strict=True):
        first = int(start) // item
        yield ids[first : first + int(length)].tolist()
