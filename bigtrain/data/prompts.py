"""Prompts for online RL (``train.objective: grpo``): records with a ``prompt`` (text, or chat ``messages``) and any
other fields a reward function reads, each prompt tokenised once at start.

A text prompt is tokenised as the start of an example (the tokenizer's leading special tokens, e.g. Llama's BOS); a
chat prompt through the chat template with the assistant's opening (``add_generation_prompt``), as TRL does. A prompt
longer than ``data.max_prompt_length`` keeps its end (TRL's rule). A row of a rollout is its prompt then its
completion: ``seq_len`` is the longest prompt plus ``train.max_completion_length``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bigtrain.data.records import describe_sources, is_chat, records_or_builtin
from bigtrain.data.tokenizer import Tokenizer, load_tokenizer
from bigtrain.errors import ConfigError

PROMPT_FIELD = "prompt"  # TRL's: text, or a list of chat messages


@dataclass
class Prompts:
    """The prompts of a run, in record order: ``ids[i]`` the tokens of prompt i, ``prompts[i]`` its text or messages
    as the reward functions receive it, ``fields[i]`` the record's other fields, ``where[i]`` where it is read from
    (``line 4``: what a reward function's error names)."""

    ids: list[np.ndarray]
    prompts: list[Any]
    fields: list[dict[str, Any]]
    where: list[str]
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
    without one); each makes ``per_prompt`` completions of a step."""
    data = cfg.data
    key, name = "data.path", PROMPT_FIELD
    tokenizer = load_tokenizer(data.tokenizer)
    ids, prompts, fields_of, places = [], [], [], []
    truncated = 0
    refusal = (
        f"grpo trains on prompts; use builtin:sums (a verifiable toy task), or give {describe_sources()} of records "
        "with a prompt field"
    )
    for where, record in records_or_builtin(key, data.path, data.split, "sums", refusal):
        if name not in record:
            raise ConfigError(
                f"{key}: {where} has no {name!r} field (its fields: {', '.join(record) or 'none'}); grpo reads a "
                f"prompt per record (text or chat messages) under {name!r}, TRL's field"
            )
        prompt = record[name]
        if is_chat(prompt):
            tokens = tokenizer.chat_ids(prompt, generation_prompt=True)
        elif isinstance(prompt, str):
            tokens = tokenizer.encode_prompt(prompt)
        else:
            raise ConfigError(
                f"{key}: {where}'s {name!r} is neither text nor chat messages ([{{role, content}}, ...]); give one"
            )
        if data.max_prompt_length is not None and len(tokens) > data.max_prompt_length:
            tokens, truncated = tokens[-data.max_prompt_length :], truncated + 1
        if not tokens:
            raise ConfigError(f"{key}: {where}'s prompt is empty; every prompt needs at least one token")
        ids.append(np.asarray(tokens, dtype=np.int64))
        prompts.append(prompt)
        fields_of.append({k: v for k, v in record.items() if k != name})
        places.append(where)
    per_step = cfg.train.global_batch_size // per_prompt
    if len(ids) < per_step:
        raise ConfigError(
            f"{key}={data.path!r} gives {len(ids)} prompt(s), fewer than one step's {per_step} "
            f"(train.global_batch_size={cfg.train.global_batch_size} / train.num_generations={per_prompt}); use "
            "more prompts or a smaller global batch"
        )
    longest = max(len(t) for t in ids)
    which = f"tokenizer {data.tokenizer}" if data.tokenizer else "the built-in byte tokenizer (257 ids)"
    note = f", {truncated} cut to data.max_prompt_length" if truncated else ""
    description = f"{data.path} (prompts: {len(ids)}, up to {longest} tokens{note}, {which})"
    return Prompts(
        ids, prompts, fields_of, places, longest + max_completion_length, tokenizer.vocab_size, tokenizer, description,
        truncated, per_prompt,
    )  # fmt: skip
