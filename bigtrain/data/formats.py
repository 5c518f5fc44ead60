"""Records -> tokenised examples: token ids and, for chat and instruction data, which tokens are trained on.

- text: the record's ``data.text_field``, then the end-of-document id; every token is a target.
- instruction (``prompt``, ``completion``): the prompt with the tokenizer's leading special tokens, the completion,
  the end-of-document id; targets are the completion and that end id (the model learns to answer and to stop).
- chat (``messages``): the conversation through the tokenizer's chat template; targets are the assistant turns.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from bigtrain.data.records import Record
from bigtrain.data.tokenizer import Tokenizer
from bigtrain.errors import ConfigError

CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Example:
    ids: list[int]
    targets: list[bool] | None  # None: every token is a target (text)


def detect_format(first: dict[str, Any]) -> str:
    """``data.format: auto``: what the first record looks like."""
    if "messages" in first:
        return "chat"
    if "prompt" in first and "completion" in first:
        return "instruction"
    return "text"


def examples(records: Iterable[Record], fmt: str, tokenizer: Tokenizer, text_field: str, key: str) -> Iterator[Example]:
    for where, record in records:
        if fmt == "text":
            text = record.get(text_field)
            if not isinstance(text, str):
                raise ConfigError(
                    f"{key} {where} has no string field {text_field!r}; set data.text_field to the field that holds "
                    "the text, or data.format to chat (messages) or instruction (prompt, completion)"
                )
            yield Example([*tokenizer.encode(text), tokenizer.eos_id], None)
        elif fmt == "instruction":
            prompt, completion = record.get("prompt"), record.get("completion")
            if not isinstance(prompt, str) or not isinstance(completion, str):
                raise ConfigError(
                    f"{key} {where} needs string fields 'prompt' and 'completion' (data.format=instruction)"
                )
            head = tokenizer.encode_prompt(prompt)
            tail = [*tokenizer.encode(completion), tokenizer.eos_id]
            yield Example(head + tail, [False] * len(head) + [True] * len(tail))
        else:
            messages = _check_messages(record.get("messages"), where, key)
            try:
                ids, targets = tokenizer.render_chat(messages)
            except ConfigError as e:
                raise ConfigError(f"{key} {where}: {e}") from e
            yield Example(ids, targets)


def _check_messages(messages: Any, where: str, key: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ConfigError(
            f"{key} {where}: 'messages' must be a non-empty list of {{'role', 'content'}} (data.format=chat)"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES or not isinstance(m.get("content"), str):
            raise ConfigError(
                f"{key} {where}: message {i} must be {{'role': one of {', '.join(CHAT_ROLES)}, 'content': a string}}, "
                f"got {m!r}"
            )
    return messages
