"""Prompts for online RL (``train.objective: grpo``): records with a ``prompt`` (text, or chat ``messages``) and any
other fields a reward function reads, tokenised once into the data cache (data/cache.py) and mapped by every later
reader, so a start reads no record and a rank's memory does not grow with the prompt set.

A text prompt is tokenised as the start of an example (the tokenizer's leading special tokens, e.g. Llama's BOS); a
chat prompt through the chat template with the assistant's opening (``add_generation_prompt``), as TRL does. A prompt
longer than ``data.max_prompt_length`` keeps its end (TRL's rule). A row of a rollout is its prompt then its
completion: ``seq_len`` is the longest prompt plus ``train.max_completion_length``.

The entry holds each prompt's tokens (``ids.bin`` and its offsets) and each record as the reward functions receive
it (``records.bin``: JSON of its place, its prompt and its other fields, decoded when a rollout asks for it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bigtrain.data import cache
from bigtrain.data.records import describe_sources, is_chat, records_or_builtin
from bigtrain.data.row_files import Ragged, id_dtype, open_ragged
from bigtrain.data.tokenizer import Tokenizer, load_tokenizer
from bigtrain.errors import ConfigError

PROMPT_FIELD = "prompt"  # TRL's: text, or a list of chat messages
IDS, OFFSETS, RECORDS, RECORD_OFFSETS = "ids.bin", "offsets.bin", "records.bin", "record_offsets.bin"
WHERE, PROMPT, FIELDS = range(3)  # a stored record: [where, prompt, other fields]


class StoredRecords:
    """Record i as ``[where, prompt, other fields]``, kept as JSON in one mapped file and decoded when asked (the
    last one decoded is kept: a rollout asks for a record's prompt, then its fields)."""

    def __init__(self, blob: Ragged) -> None:
        self.blob = blob
        self._last: tuple[int, list[Any]] | None = None

    def __len__(self) -> int:
        return len(self.blob)

    def __getitem__(self, i: int) -> list[Any]:
        i = int(i)
        if self._last is None or self._last[0] != i:
            start, end = int(self.blob.offsets[i]), int(self.blob.offsets[i + 1])
            self._last = (i, json.loads(self.blob.flat[start:end].tobytes()))
        return self._last[1]


class Column:
    """One part of every stored record (``where``, ``prompt`` or ``fields``), indexed as a list."""

    def __init__(self, records: StoredRecords, part: int) -> None:
        self.records, self.part = records, part

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> Any:
        return self.records[i][self.part]


@dataclass
class Prompts:
    """The prompts of a run, in record order: ``ids[i]`` the tokens of prompt i, ``prompts[i]`` its text or messages
    as the reward functions receive it, ``fields[i]`` the record's other fields, ``where[i]`` where it is read from
    (``line 4``: what a reward function's error names). Each is read from the data cache when asked for."""

    ids: Any  # data/row_files.Ragged
    prompts: Any  # Column
    fields: Any
    where: Any
    seq_len: int
    vocab_size: int
    tokenizer: Tokenizer
    description: str
    cut: int = 0  # prompts cut to data.max_prompt_length
    examples_per_record: int = 1  # completions of the global batch each prompt makes (train.num_generations)
    cache_note: str | None = field(default=None)
    streamed = False
    truncated = 0  # no record is cut by data.seq_len (a row is its prompt and completion)

    @property
    def num_rows(self) -> int:
        return len(self.ids)


def read_prompts(cfg: Any, max_completion_length: int, per_prompt: int) -> Prompts:
    """``data.path``'s prompts, tokenised with the recipe's tokenizer (``data.tokenizer``; the byte tokenizer
    without one) into the data cache, or read from it; each makes ``per_prompt`` completions of a step."""
    data = cfg.data
    key = "data.path"
    refusal = (
        f"grpo trains on prompts; use builtin:sums (a verifiable toy task), or give {describe_sources()} of records "
        f"with a {PROMPT_FIELD} field"
    )
    records = records_or_builtin(key, data.path, data.split, "sums", refusal)  # a bad path is refused here, at once
    tokenizer = load_tokenizer(data.tokenizer)
    parts = {
        "kind": "prompts",
        "source": cache.source_identity(data.path),
        "tokenizer": cache.tokenizer_identity(data.tokenizer),
        "split": data.split,
        "max_prompt_length": data.max_prompt_length,
    }
    build = lambda out: _build(records, tokenizer, data.max_prompt_length, key, out)  # noqa: E731
    found = cache.entry(cache.cache_dir_of(data), "prompts", key, parts, build)
    meta, folder = found.meta, found.folder
    n = meta["prompts"]
    stored = StoredRecords(open_ragged(folder, RECORDS, RECORD_OFFSETS, n, "|u1"))
    per_step = cfg.train.global_batch_size // per_prompt
    if n < per_step:
        raise ConfigError(
            f"{key}={data.path!r} gives {n} prompt(s), fewer than one step's {per_step} "
            f"(train.global_batch_size={cfg.train.global_batch_size} / train.num_generations={per_prompt}); use "
            "more prompts or a smaller global batch"
        )
    which = f"tokenizer {data.tokenizer}" if data.tokenizer else "the built-in byte tokenizer (257 ids)"
    cut = meta["cut"]
    note = f", {cut} cut to data.max_prompt_length" if cut else ""
    description = f"{data.path} (prompts: {n}, up to {meta['longest']} tokens{note}, {which})"
    return Prompts(
        open_ragged(folder, IDS, OFFSETS, n, meta["dtype"]), Column(stored, PROMPT), Column(stored, FIELDS),
        Column(stored, WHERE), meta["longest"] + max_completion_length, tokenizer.vocab_size, tokenizer, description,
        cut, per_prompt, found.note(key),
    )  # fmt: skip


def _build(records: Any, tokenizer: Tokenizer, max_length: int | None, key: str, out: Path) -> dict[str, Any]:
    """Each record's prompt tokenised (its end kept to ``max_length``) into ``out``, with the record as JSON."""
    dtype = id_dtype(tokenizer.vocab_size - 1)
    lengths, sizes, cut, longest = [0], [0], 0, 0
    with (out / IDS).open("wb") as ids_file, (out / RECORDS).open("wb") as records_file:
        for where, record in cache.counted(records, key, "tokenising prompts"):
            tokens = _prompt_ids(tokenizer, record, where, key)
            if max_length is not None and len(tokens) > max_length:
                tokens, cut = tokens[-max_length:], cut + 1
            if not tokens:
                raise ConfigError(f"{key}: {where}'s prompt is empty; every prompt needs at least one token")
            ids_file.write(np.asarray(tokens, dtype=dtype).tobytes())
            stored = _as_json(where, record, key)
            records_file.write(stored)
            lengths.append(len(tokens))
            sizes.append(len(stored))
            longest = max(longest, len(tokens))
    if len(lengths) == 1:
        raise ConfigError(f"{key} holds no records; grpo reads a prompt per record")
    np.cumsum(np.asarray(lengths, dtype=np.int64)).tofile(out / OFFSETS)
    np.cumsum(np.asarray(sizes, dtype=np.int64)).tofile(out / RECORD_OFFSETS)
    return {"prompts": len(lengths) - 1, "longest": longest, "cut": cut, "dtype": dtype.str}


def _prompt_ids(tokenizer: Tokenizer, record: dict[str, Any], where: str, key: str) -> list[int]:
    if PROMPT_FIELD not in record:
        raise ConfigError(
            f"{key}: {where} has no {PROMPT_FIELD!r} field (its fields: {', '.join(record) or 'none'}); grpo reads a "
            f"prompt per record (text or chat messages) under {PROMPT_FIELD!r}, TRL's field"
        )
    prompt = record[PROMPT_FIELD]
    if is_chat(prompt):
        return tokenizer.chat_ids(prompt, generation_prompt=True)
    if isinstance(prompt, str):
        return tokenizer.encode_prompt(prompt)
    raise ConfigError(
        f"{key}: {where}'s {PROMPT_FIELD!r} is neither text nor chat messages ([{{role, content}}, ...]); give one"
    )


def _as_json(where: str, record: dict[str, Any], key: str) -> bytes:
    """The record as stored: JSON keeps text, numbers, lists and mappings as the reward functions read them; a value
    it cannot keep is named rather than turned into something else."""
    fields = {k: v for k, v in record.items() if k != PROMPT_FIELD}
    try:
        return json.dumps([where, record[PROMPT_FIELD], fields], ensure_ascii=False).encode()
    except (TypeError, ValueError):
        for name, value in record.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"{key}: {where}'s field {name!r} holds a {type(value).__name__}, which the prompt cache cannot "
                    "keep (text, numbers, lists and mappings only); give it as text or numbers"
                ) from None
        raise
