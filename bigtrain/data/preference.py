"""Preference pairs (``train.objective`` dpo, ipo, orpo, simpo): records of a prompt, a chosen and a rejected answer.

Formats, as TRL's preference datasets: plain text (``{"prompt": str, "chosen": str, "rejected": str}``), or
conversational (``prompt`` a list of chat messages, ``chosen``/``rejected`` the assistant's message(s)); without a
``prompt`` field, the messages ``chosen`` and ``rejected`` share from their start are the prompt. Tokenised as TRL
does: conversational records through the tokenizer's chat template (the prompt with the generation prompt), plain
text with the tokenizer's own special tokens and an end-of-sequence token closing each answer; the answer starts where
the tokenised prompt and the tokenised prompt + answer part. Each side becomes one row of ``data.seq_len`` (TRL's
max_length): the prompt's end kept within ``data.max_prompt_length``, the answer cut at its end, right-padded,
labelled on the answer alone. Packing is not built: one pair is two rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigtrain.config.schema import DataConfig
from bigtrain.data import cache
from bigtrain.data.batch import PairBatch
from bigtrain.data.indexed_rows import IndexedRows
from bigtrain.data.labels import masked_next_token_labels
from bigtrain.data.records import Record, describe_sources, is_chat, records_or_builtin
from bigtrain.data.row_files import RowWriter, open_rows
from bigtrain.data.tokenizer import load_tokenizer
from bigtrain.errors import ConfigError

SIDES = ("chosen", "rejected")
MARGIN_FIELD = "margin"  # TRL's: how far the chosen answer's reward should lead the rejected one's (reward models)
MARGINS_FILE = "margins.npy"


@dataclass
class PreferencePairs(IndexedRows):
    """Pairs as two token arrays of one row each, what each row trains on, and the reference's log-probabilities."""

    ids: np.ndarray  # [pairs, 2, seq_len] integer ids (mapped from the data cache): chosen, rejected
    targets: np.ndarray  # [pairs, 2, seq_len] bool: the answer's tokens
    vocab_size: int
    description: str
    index: np.ndarray | None = None  # the pairs of ``ids`` these are (a split of them), in order; None: all
    # [num_rows, 2] fp32 in these pairs' order, parallel.reference=precomputed (roles/reference_pass.py)
    ref_logps: np.ndarray | None = None
    truncated: int = 0  # pairs with an answer or a prompt cut
    examples: int = 0
    positions: None = None  # never packed
    cache_note: str | None = None  # where in the data cache, and whether this start built it
    # [pairs] fp32: each record's ``margin`` field where the data has one (0 where a record has none); None: no
    # record has one
    margins: np.ndarray | None = None
    pad_id: int = 0  # the tokenizer's pad id (else its eos id): what a score head's rows are padded with

    @property
    def seq_len(self) -> int:
        return int(self.ids.shape[2])

    def micro_batch(self, rows: np.ndarray, seen: np.ndarray | None = None) -> PairBatch:
        """Pairs ``rows`` as one micro-batch: their chosen rows, then their rejected rows."""
        at = self.at(rows)
        ids = torch.from_numpy(np.concatenate([self.ids[at, 0], self.ids[at, 1]]).astype(np.int64))
        targets = np.concatenate([self.targets[at, 0], self.targets[at, 1]])
        labels = masked_next_token_labels(ids, targets)
        ref = None
        if self.ref_logps is not None:  # computed for these pairs, in their order (not the whole file's)
            ref = torch.from_numpy(np.concatenate([self.ref_logps[rows, 0], self.ref_logps[rows, 1]]))
        return PairBatch(ids, labels, ref)


def _split_prompt(where: str, record: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(prompt, chosen, rejected) of a record, the prompt taken from the shared start of a conversation without one;
    a missing or empty side is an error naming the record."""
    for side in SIDES:
        if side not in record:
            raise ConfigError(
                f"{where}: no {side!r} field; a preference record has prompt, chosen and rejected (text, or chat "
                f"messages), found {sorted(record)}"
            )
        if not record[side]:
            raise ConfigError(f"{where}: {side!r} is empty; every pair needs a chosen and a rejected answer")
    chosen, rejected = record["chosen"], record["rejected"]
    if "prompt" in record:
        return record["prompt"], chosen, rejected
    if not (is_chat(chosen) and is_chat(rejected)):
        raise ConfigError(f"{where}: no 'prompt' field; text pairs need one (chat pairs may share their start)")
    shared = _common_prefix(chosen, rejected)
    if shared == 0:
        raise ConfigError(f"{where}: chosen and rejected share no first message to be the prompt; add a 'prompt'")
    return chosen[:shared], chosen[shared:], rejected[shared:]


def _common_prefix(a: list[Any], b: list[Any]) -> int:
    """How many leading items (token ids, chat messages) ``a`` and ``b`` share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _tokenise(tokenizer: Any, where: str, prompt: Any, answers: tuple[Any, Any]) -> tuple[list[int], list[list[int]]]:
    """The prompt's ids and each answer's ids (TRL's rule: the answer starts where the ids part)."""
    chat = is_chat(prompt)
    if chat != all(is_chat(a) for a in answers):
        raise ConfigError(f"{where}: mix of chat messages and plain text; use one form for prompt, chosen and rejected")
    if chat:
        prompt_ids = tokenizer.chat_ids(prompt, generation_prompt=True)
        whole = [tokenizer.chat_ids(prompt + answer, generation_prompt=False) for answer in answers]
    else:
        prompt_ids = tokenizer.encode_prompt(prompt)
        whole = []
        for answer in answers:
            ids = tokenizer.encode_prompt(prompt + answer)
            whole.append(ids if ids[-1] == tokenizer.eos_id else [*ids, tokenizer.eos_id])
    cut = min(_common_prefix(prompt_ids, ids) for ids in whole)
    return prompt_ids[:cut], [ids[cut:] for ids in whole]


def load_preference_pairs(cfg: DataConfig, key: str = "data.path", path: str | None = None) -> PreferencePairs:
    """``data.path`` (or ``data.eval_path``) as preference pairs of rows of ``data.seq_len``."""
    path = cfg.path if path is None else path
    refusal = (
        f"preference objectives train on pairs; use builtin:preferences, or give {describe_sources()} of "
        "prompt/chosen/rejected records"
    )
    records = records_or_builtin(key, path, cfg.split, "preferences", refusal)
    if cfg.seq_len is None:
        raise ConfigError(f"{key}: set data.seq_len, the longest prompt + answer of a row (TRL's max_length)")
    if cfg.packing is not None:
        raise ConfigError(
            f"data.packing={cfg.packing}: preference pairs are not packed (each side is one padded row, both in one "
            "micro-batch); unset data.packing"
        )
    parts = {
        "kind": "preference pairs",
        "source": cache.source_identity(path),
        "tokenizer": cache.tokenizer_identity(cfg.tokenizer),
        **{name: getattr(cfg, name) for name in ("seq_len", "max_prompt_length", "split")},
        "margin_field": MARGIN_FIELD,  # entries built before margins were kept are not read
    }
    found = cache.entry(cache.cache_dir_of(cfg), "pairs", key, parts, lambda out: _build(cfg, key, path, records, out))
    meta = found.meta
    rows = open_rows(found.folder, 2 * meta["pairs"], cfg.seq_len, meta["dtypes"])
    shape = (meta["pairs"], 2, cfg.seq_len)
    which = f"tokenizer {cfg.tokenizer}" if cfg.tokenizer else "the built-in byte tokenizer (257 ids)"
    note = f", {meta['truncated']} truncated" if meta["truncated"] else ""
    description = f"{path} (preference: {meta['pairs']} pairs, rows of {cfg.seq_len}{note}, {which})"
    margins = np.load(found.folder / MARGINS_FILE, mmap_mode="r") if meta["margins"] else None
    return PreferencePairs(
        rows["rows"].reshape(shape),  # type: ignore[union-attr]
        rows["targets"].reshape(shape),  # type: ignore[union-attr]
        meta["vocab_size"],
        description,
        truncated=meta["truncated"],
        examples=meta["pairs"],
        cache_note=found.note(key),
        margins=margins,
        pad_id=meta["pad_id"],
    )


def read_pairs_and_held_out(cfg: Any, hf_config: Any) -> tuple[PreferencePairs, PreferencePairs | None]:
    """Pairs of ``data.path`` and the held-out ones (``data.eval_path`` or ``data.eval_fraction``), their ids checked
    against the model's vocabulary."""
    from bigtrain.data.held_out import with_held_out
    from bigtrain.data.sources import check_vocabulary

    def read(key: str, path: str) -> PreferencePairs:
        pairs = load_preference_pairs(cfg.data, key, path)
        check_vocabulary(pairs, hf_config.vocab_size, path, key=key)
        return pairs

    return with_held_out(cfg, read("data.path", cfg.data.path), read, "pairs")


def _build(cfg: DataConfig, key: str, path: str, records: Iterable[Record], out: Path) -> dict[str, Any]:
    """The pairs tokenised (each side one row: the chosen, then the rejected) into row files in ``out``."""
    assert cfg.seq_len is not None
    tokenizer = load_tokenizer(cfg.tokenizer)
    seq_len, keep_prompt = cfg.seq_len, cfg.max_prompt_length
    writer = RowWriter(out, seq_len, tokenizer.vocab_size, targets=True, positions=False)
    pairs, truncated, differ = 0, 0, 0
    margins: list[float] = []
    for line, record in cache.counted(records, key, "tokenising"):
        where = f"{key}={path!r} {line}"
        prompt, chosen, rejected = _split_prompt(where, record)
        margins.append(_margin(where, record))
        prompt_ids, answers = _tokenise(tokenizer, where, prompt, (chosen, rejected))
        if not prompt_ids:  # the answer's first token is predicted from the prompt's last: there must be one
            raise ConfigError(f"{where}: the prompt is empty; every pair needs a prompt its answers follow")
        cut = False
        if keep_prompt is not None and len(prompt_ids) > keep_prompt:
            prompt_ids, cut = prompt_ids[-keep_prompt:], True
        if len(prompt_ids) >= seq_len:
            raise ConfigError(
                f"{where}: the prompt is {len(prompt_ids)} tokens, which leaves no room for an answer in "
                f"data.seq_len={seq_len}; raise data.seq_len, set data.max_prompt_length (e.g. {seq_len // 2}), or "
                "drop the record"
            )
        sides = []
        for answer in answers:
            row = (prompt_ids + answer)[:seq_len]
            cut = cut or len(prompt_ids) + len(answer) > seq_len
            fill = seq_len - len(row)
            target = [False] * len(prompt_ids) + [True] * (len(row) - len(prompt_ids)) + [False] * fill
            sides.append((row + [tokenizer.eos_id] * fill, target))
        for ids, target in sides:
            writer.add(ids, target, None)
        differ += sides[0][0] != sides[1][0]
        truncated += cut
        pairs += 1
    dtypes = writer.close()
    if not pairs:
        raise ConfigError(f"{key}={path!r} holds no records; give {describe_sources()} of preference pairs")
    if differ == 0:
        raise ConfigError(
            f"{key}={path!r}: in every pair the chosen and the rejected answer are the same tokens (within "
            f"data.seq_len={seq_len}); nothing to prefer: check the data's chosen and rejected fields"
        )
    has_margins = any(m != 0 for m in margins)
    if has_margins:
        np.save(out / MARGINS_FILE, np.asarray(margins, dtype=np.float32))
    return {
        "pairs": pairs,
        "truncated": truncated,
        "vocab_size": tokenizer.vocab_size,
        "dtypes": dtypes,
        "margins": has_margins,
        "pad_id": tokenizer.pad_id,
    }


def _margin(where: str, record: dict[str, Any]) -> float:
    """A record's ``margin`` (0 without one); anything but a finite number is an error naming the record."""
    value = record.get(MARGIN_FIELD)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ConfigError(f"{where}: {MARGIN_FIELD!r} is {value!r}; give a finite number (or leave the field out)")
    return float(value)
