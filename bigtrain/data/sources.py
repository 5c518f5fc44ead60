"""Data sources: everything becomes token rows ``[num_sequences, seq_len]``, with what each row trains on.

A tokenised ``.npy`` is used as it is (memory-mapped): every next token is a target. Records (``.jsonl``, ``.txt``,
local HF datasets, built-in) are read as a stream, tokenised by format (data/formats.py: text, chat, instruction) and
packed into rows (data/packing.py: stream, documents, pad) written once into the data cache (data/cache.py), whose
files every rank, restart and later run maps.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from bigtrain.config.schema import DataConfig
from bigtrain.data.blend import BlendedRows, blend, check_sources
from bigtrain.data.builtin import builtin_records
from bigtrain.data.records import check_records_path, describe_sources, is_glob
from bigtrain.data.row_cache import BUILTIN_PREFIX, megatron_rows, records_rows
from bigtrain.data.rows import TokenRows
from bigtrain.data.stream import StreamedRows
from bigtrain.data.token_files import index_of, is_token_file, stream_rows
from bigtrain.errors import ConfigError


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


def load_training_rows(cfg: DataConfig, seed: int) -> TokenRows | BlendedRows | StreamedRows:
    """``data.path``'s rows, streamed (data/stream.py), or the blend of ``data.sources`` (data/blend.py)."""
    if cfg.streaming:
        return streamed_rows(cfg)
    if not cfg.sources:
        return load_token_rows(cfg)
    check_sources(cfg.sources)
    if cfg.path != DataConfig.path:  # type: ignore[comparison-overlap]
        raise ConfigError(f"data.path={cfg.path!r} and data.sources are both set; give one (a source per path)")
    if cfg.eval_fraction > 0:
        raise ConfigError("data.eval_fraction holds out rows of one source; with data.sources give data.eval_path")
    keys = [f"data.sources[{i}].path" for i in range(len(cfg.sources))]
    parts = [load_token_rows(cfg, key, source["path"]) for key, source in zip(keys, cfg.sources, strict=True)]
    names = [source["path"] for source in cfg.sources]
    return blend(parts, names, cfg.sources, cfg.shuffle, seed)


def streamed_rows(cfg: DataConfig) -> StreamedRows:
    """``data.streaming``: what a stream cannot do is refused before it is opened."""
    refused = [
        (bool(cfg.sources), "data.sources blends indexed sources; stream one source through data.path"),
        (cfg.eval_fraction > 0, "data.eval_fraction holds rows out of an indexed source; give data.eval_path"),
        (cfg.path.startswith(BUILTIN_PREFIX), f"data.path={cfg.path!r} is generated, not a dataset to stream"),
        (cfg.seq_len is None, "data.seq_len is required; e.g. data.seq_len=2048"),
        (cfg.workers > 0, "data.workers reads indexed rows ahead; a stream is read in the training process: set 0"),
    ]
    for wrong, why in refused:
        if wrong:
            raise ConfigError(f"data.streaming: {why}")
    return StreamedRows(cfg, "data.path", cfg.path)


def parts_of(data: TokenRows | BlendedRows, cfg: DataConfig) -> list[tuple[TokenRows, str, str]]:
    """(rows, path, key) of each source of ``data``: itself, or a blend's sources."""
    if isinstance(data, BlendedRows):
        return [
            (s, n, f"data.sources[{i}].path") for i, (s, n) in enumerate(zip(data.sources, data.names, strict=True))
        ]
    return [(data, cfg.path, "data.path")]


def check_data_config(cfg: DataConfig, key: str = "data.path", path: str | None = None) -> None:
    """Fail early, on every rank, for a data path that cannot work."""
    path = cfg.path if path is None else path
    tokens = is_token_file(path) and not is_glob(path)
    if path.startswith(BUILTIN_PREFIX):
        builtin_records(path.removeprefix(BUILTIN_PREFIX), num_records=0)
    elif tokens:
        if not Path(path).is_file():
            raise ConfigError(f"{key}={path!r} does not exist; give a token file (.bin) or {describe_sources()}")
    else:
        check_records_path(key, path)
    is_npy = path.endswith(".npy") and not is_glob(path)
    if not is_npy and cfg.seq_len is None:
        what = "token files" if tokens else "text, chat and instruction data"
        raise ConfigError(f"data.seq_len is required for {what}; e.g. data.seq_len=128")
    if (is_npy or tokens) and cfg.format not in ("auto", "text"):
        raise ConfigError(f"{key}={path!r} is tokenised already; data.format={cfg.format} applies to records only")
    if cfg.seq_len is not None and cfg.seq_len < 2:
        raise ConfigError(f"data.seq_len={cfg.seq_len} must be at least 2 (one input and one predicted token)")


def load_token_rows(cfg: DataConfig, key: str = "data.path", path: str | None = None) -> TokenRows:
    """``data.path`` (or another path of the same recipe, e.g. ``data.eval_path``) as token rows: a tokenised
    ``.npy`` mapped as it is, records through the data cache (tokenised and packed once, then mapped)."""
    path = cfg.path if path is None else path
    check_data_config(cfg, key, path)
    if path.endswith(".npy") and not is_glob(path):
        return _load_npy(cfg, key, path)
    if is_token_file(path) and not is_glob(path):
        return _load_token_file(cfg, key, path)
    return records_rows(cfg, key, path)


def _load_token_file(cfg: DataConfig, key: str, path: str) -> TokenRows:
    """A flat token file or a Megatron pair (data/token_files.py): stream rows are a view of the file; a Megatron
    pair's documents packed whole are built once into the data cache."""
    assert cfg.seq_len is not None
    mode = cfg.packing or "stream"
    if mode == "stream":
        rows = stream_rows(key, path, cfg.token_dtype, cfg.seq_len)
        kind = "Megatron indexed" if index_of(path).is_file() else f"flat {cfg.token_dtype} tokens"
        return TokenRows(rows, None, f"{path} ({kind}, {len(rows)} stream-packed rows of {cfg.seq_len})")
    if not index_of(path).is_file():
        raise ConfigError(
            f"{key}={path!r} is a flat token file (no {index_of(path).name} beside it): it has no document "
            f"boundaries to pack by; use data.packing=stream, or Megatron's .bin/.idx pair for data.packing={mode}"
        )
    return megatron_rows(cfg, key, path, mode)


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
READ_CHUNK_IDS = 1 << 24  # ids read at a time when a file's id range is found


def id_range(rows: np.ndarray, key: str, cache_dir: Path | None = None) -> tuple[int, int] | None:
    """(smallest, largest) id of rows mapped from a file (a .npy, a token .bin), from the data cache or by reading
    the file once; None for rows held in memory."""
    from bigtrain.data import cache

    filename = getattr(rows, "filename", None)
    if filename is None:
        return None
    offset, dtype, count = int(rows.offset), rows.dtype, int(rows.size)
    parts = {"kind": "id range", "source": cache.files_identity([Path(filename)]), "offset": offset,
             "dtype": dtype.str, "count": count}  # fmt: skip

    def scan(out: Path) -> dict[str, int]:
        low, high = None, None
        with open(filename, "rb") as f:
            f.seek(offset)
            left = count
            while left:
                chunk = np.fromfile(f, dtype=dtype, count=min(left, READ_CHUNK_IDS))
                if not len(chunk):
                    break
                left -= len(chunk)
                low = int(chunk.min()) if low is None else min(low, int(chunk.min()))
                high = int(chunk.max()) if high is None else max(high, int(chunk.max()))
        return {"min": low if low is not None else 0, "max": high if high is not None else 0}

    found = cache.entry(cache_dir or cache.default_cache_dir(), "ids", key, parts, scan)
    return found.meta["min"], found.meta["max"]


def check_vocabulary(
    data: TokenRows, vocab_size: int, data_path: str, key: str = "data.path", cache_dir: Path | None = None
) -> None:
    """Every token id must index the model's embedding: checked once, before training, on every rank.

    Text was tokenised by a tokenizer of known size; a pre-tokenised file's smallest and largest ids are found by
    reading it once (plain reads a chunk at a time: its pages are not mapped into the rank, whose memory stays flat)
    and kept in the data cache, so a restart reads nothing; only a file with a bad id is scanned for the first one,
    so a bad id fails now, named, rather than when its batch comes up, hours into a run.
    """
    if data.vocab_size is not None:
        if data.vocab_size > vocab_size:
            raise ConfigError(
                f"the tokenizer has {data.vocab_size} ids but the model's vocab_size is {vocab_size}; "
                f"set model.config.vocab_size >= {data.vocab_size} or use a matching data.tokenizer"
            )
        return
    ids = id_range(data.rows, key, cache_dir)
    if ids is not None and 0 <= ids[0] and ids[1] < vocab_size:
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
