"""Token rows through the data cache (data/cache.py): records tokenised by format, or a Megatron pair's documents,
packed into row files once, then mapped by every reader.

An entry's name is a digest of the source's files (path, size, modification time), the tokenizer's files, and the
keys that change the rows (format, packing, seq_len, text field, split); its ``meta.json`` says what the rows are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from bigtrain.config.schema import DataConfig
from bigtrain.data import cache
from bigtrain.data.builtin import builtin_records
from bigtrain.data.formats import Example, detect_format
from bigtrain.data.packing import PackCounts, layout, pack
from bigtrain.data.parallel_examples import build_processes, tokenised
from bigtrain.data.records import Record, describe_sources, read_records
from bigtrain.data.row_files import RowWriter, open_rows
from bigtrain.data.rows import TokenRows
from bigtrain.data.token_files import documents, read_megatron_index
from bigtrain.data.token_files import index_of as megatron_index
from bigtrain.data.tokenizer import load_tokenizer
from bigtrain.errors import ConfigError

BUILTIN_PREFIX = "builtin:"
# the recipe keys whose values change the rows built from one source
ROW_KEYS = ("format", "packing", "seq_len", "text_field", "split")


def records_rows(cfg: DataConfig, key: str, path: str) -> TokenRows:
    """Records (``.jsonl``, ``.txt``, a local HF dataset, a built-in corpus) tokenised by format and packed."""
    which = f"tokenizer {cfg.tokenizer}" if cfg.tokenizer else "the built-in byte tokenizer (257 ids)"
    parts = {
        "kind": "token rows",
        "source": cache.source_identity(path),
        "tokenizer": cache.tokenizer_identity(cfg.tokenizer),
    }
    return _cached(cfg, key, path, parts, lambda folder: _build_records(cfg, key, path, folder), which)


def megatron_rows(cfg: DataConfig, key: str, path: str, mode: str) -> TokenRows:
    """A Megatron pair's documents (each sequence of its index), packed whole by ``mode`` (documents or pad)."""
    source = cache.files_identity([Path(path), megatron_index(path)])
    parts = {"kind": "token rows", "source": source, "tokenizer": None}
    return _cached(cfg, key, path, parts, lambda folder: _build_documents(cfg, key, path, mode, folder), "ids as read")


def _cached(
    cfg: DataConfig, key: str, path: str, parts: dict[str, Any], build: Callable[[Path], dict[str, Any]], which: str
) -> TokenRows:
    cache_dir = cache.cache_dir_of(cfg)
    parts = {**parts, **{name: getattr(cfg, name) for name in ROW_KEYS}}
    found = cache.entry(cache_dir, "rows", key, parts, build)
    meta = found.meta
    arrays = open_rows(found.folder, meta["num_rows"], meta["seq_len"], meta["dtypes"])
    cut = f", {meta['truncated']} truncated to seq_len" if meta["truncated"] else ""
    rows = f"{meta['num_rows']} {meta['mode']}-packed rows of {meta['seq_len']}{cut}"
    return TokenRows(
        arrays["rows"],  # type: ignore[arg-type]
        meta["vocab_size"],
        f"{path} ({meta['format']}: {meta['examples']} examples, {rows}, {which})",
        arrays["targets"],
        arrays["positions"],
        truncated=meta["truncated"],
        examples=meta["examples"],
        cache_note=found.note(key),
        padded=meta["mode"] == "pad",
    )


def _build_records(cfg: DataConfig, key: str, path: str, folder: Path) -> dict[str, Any]:
    """Records read as a stream, tokenised by format (by the node's CPUs, in order) and packed into row files in
    ``folder``; what the entry's ``meta.json`` says of them."""
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

    def examples(counted: Iterator[Record]) -> Iterator[Example]:
        return tokenised(counted, fmt, tokenizer, cfg.text_field, key, build_processes())

    return _write(
        cfg, key, path, folder, chain([first], records), examples, fmt, mode, tokenizer.vocab_size, tokenizer.eos_id
    )


def _build_documents(cfg: DataConfig, key: str, path: str, mode: str, folder: Path) -> dict[str, Any]:
    dtype = read_megatron_index(key, megatron_index(path)).dtype
    vocab = int(np.iinfo(dtype).max) + 1  # what the rows' dtype must hold; the model's vocabulary is checked after

    def examples(docs: Iterator[list[int]]) -> Iterator[Example]:
        return (Example(ids, None) for ids in docs)

    # padding (never a target) is id 0: a pre-tokenised corpus names no end-of-document id
    return _write(cfg, key, path, folder, documents(key, path), examples, "text", mode, vocab, 0, tokenizer=False)


def _write(
    cfg: DataConfig,
    key: str,
    path: str,
    folder: Path,
    items: Iterable[Any],
    examples: Callable[[Iterator[Any]], Iterator[Example]],
    fmt: str,
    mode: str,
    vocab: int,
    pad_id: int,
    tokenizer: bool = True,
) -> dict[str, Any]:
    """Items (records or documents) made examples and packed into row files, with the cache's progress bar."""
    assert cfg.seq_len is not None
    with_targets, with_positions = layout(mode, masked=fmt != "text")
    writer = RowWriter(folder, cfg.seq_len, vocab, with_targets, with_positions)
    doing = "tokenising" if tokenizer else "packing"
    counts: PackCounts
    try:
        counts = pack(examples(cache.counted(items, key, doing)), cfg.seq_len, mode, pad_id, writer)
    finally:
        dtypes = writer.close()
    if writer.num_rows == 0:
        raise ConfigError(
            f"{key}={path!r} gives fewer tokens than one sequence of data.seq_len={cfg.seq_len}; "
            "use more data or a shorter data.seq_len"
        )
    if with_targets and not counts.any_target:
        raise ConfigError(
            f"{key}={path!r}: no {fmt} example has a token to train on within data.seq_len={cfg.seq_len} (chat: no "
            "assistant turn; instruction: empty completions, or prompts longer than seq_len); check the data or "
            "raise data.seq_len"
        )
    return {
        "format": fmt,
        "mode": mode,
        "seq_len": cfg.seq_len,
        "num_rows": writer.num_rows,
        "dtypes": dtypes,
        "vocab_size": vocab if tokenizer else None,
        "examples": counts.examples,
        "truncated": counts.truncated,
    }
