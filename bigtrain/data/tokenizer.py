"""Tokenizers: a local HuggingFace tokenizer, or the built-in byte-level one that needs no files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bigtrain.config.load import TOKENIZER_FILES, has_tokenizer
from bigtrain.errors import ConfigError


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int
    pad_id: int  # what rows are padded with where padding is read (a score head's last token): its pad, else eos

    def encode(self, text: str) -> list[int]: ...

    def encode_prompt(self, text: str) -> list[int]: ...

    def render_chat(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[bool]]: ...

    def chat_ids(self, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


NO_TEMPLATE = (
    "chat data is rendered with the tokenizer's chat template, and the built-in byte tokenizer has none; set "
    "data.tokenizer to a local HF tokenizer folder with a chat template (e.g. an instruct model's folder)"
)


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 plus an end-of-document id 256: no vocabulary file, works on any text."""

    vocab_size = 257
    eos_id = 256
    pad_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text)

    def render_chat(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[bool]]:
        raise ConfigError(NO_TEMPLATE)

    def chat_ids(self, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        raise ConfigError(NO_TEMPLATE)

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, the end-of-document id dropped (a generated completion's text)."""
        return bytes(i for i in ids if i < self.eos_id).decode("utf-8", errors="replace")


class HFTokenizer:
    """A tokenizer folder loaded with ``AutoTokenizer.from_pretrained`` (local files only, never the hub)."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        folder = Path(path)
        if not folder.is_dir():
            raise ConfigError(f"data.tokenizer={path!r} is not a folder; point it at a local HF tokenizer folder")
        if not has_tokenizer(folder):
            raise ConfigError(
                f"data.tokenizer={path!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); point it at "
                "a folder written by tokenizer.save_pretrained, e.g. the model's own folder"
            )
        try:
            self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"data.tokenizer={path!r} is not a local HF tokenizer folder ({e}); point it at one"
            ) from e
        if self._tok.eos_token_id is None:
            raise ConfigError(f"data.tokenizer={path!r} has no eos token to separate packed documents")
        self.path = path
        self.eos_id = int(self._tok.eos_token_id)
        pad = self._tok.pad_token_id  # TRL's reward trainer pads with the pad token, else the eos token
        self.pad_id = self.eos_id if pad is None else int(pad)
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def encode_prompt(self, text: str) -> list[int]:
        """The start of an example: with the tokenizer's own leading special tokens (Llama's BOS, ...)."""
        return self._tok.encode(text, add_special_tokens=True)

    def render_chat(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[bool]]:
        """A conversation through the chat template: its ids, and which ids are assistant output.

        Each assistant turn's text is found by rendering the conversation up to it (with the generation prompt) and
        through it: the characters in between are what the model says, end-of-turn marker included, so it learns to
        stop. The whole text is tokenised once and a token is a target when it starts inside such a span; rendering
        texts (not ids) keeps tokenisation at span edges exactly that of the full conversation.
        """
        tok = self._tok
        if tok.chat_template is None:
            raise ConfigError(
                f"data.tokenizer={self.path!r} has no chat template to render chat data; use the tokenizer of an "
                "instruct/chat model, or convert the data to prompt/completion records"
            )
        if not tok.is_fast:
            raise ConfigError(
                f"data.tokenizer={self.path!r} is a slow (Python) tokenizer; locating the assistant's tokens needs "
                "a fast one (a tokenizer.json in the folder)"
            )
        import jinja2

        try:
            return self._render_chat(tok, messages)
        except jinja2.TemplateError as e:
            raise ConfigError(f"the chat template refuses this conversation ({e})") from e

    def chat_ids(self, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        """A conversation's ids through the chat template (``generation_prompt``: followed by the assistant's
        opening, as a prompt is before its answer)."""
        if self._tok.chat_template is None:
            raise ConfigError(f"data.tokenizer={self.path!r} has no chat template to render chat pairs; use text pairs")
        out = self._tok.apply_chat_template(
            messages, tokenize=True, return_dict=True, add_generation_prompt=generation_prompt
        )
        return list(out["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` without special tokens (a generated completion's text, as TRL decodes it)."""
        return self._tok.decode(ids, skip_special_tokens=True)

    @staticmethod
    def _render_chat(tok: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[bool]]:
        def render(part: list[dict[str, Any]], generation_prompt: bool) -> str:
            return tok.apply_chat_template(part, tokenize=False, add_generation_prompt=generation_prompt)

        text, spans = assistant_spans(render, messages)
        encoded = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(encoded["input_ids"]), targets_in(spans, encoded["offset_mapping"])


def assistant_spans(
    render: Callable[[list[dict[str, Any]], bool], str], messages: list[dict[str, Any]]
) -> tuple[str, list[tuple[int, int]]]:
    """A conversation's text through a chat template (``render(messages, generation_prompt)``) and the character
    spans of its assistant turns: each found by rendering the conversation up to it (with the generation prompt) and
    through it; the characters in between are what the model says, end-of-turn marker included."""
    text = render(messages, False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        if i:
            before = render(messages[:i], True)
        else:  # a conversation that opens with the assistant: the template's preamble is not its text
            try:
                before = render([], True)
            except Exception:  # noqa: BLE001 - a template that needs a message: no preamble to skip
                before = ""
        through = render(messages[: i + 1], False)
        if not (text.startswith(through) and through.startswith(before)):
            raise ConfigError(
                "the chat template renders an earlier assistant turn differently inside a longer conversation "
                "(e.g. it drops reasoning from past turns), so the assistant tokens cannot be located; use "
                "prompt/completion records, one per assistant turn"
            )
        spans.append((len(before), len(through)))
    return text, spans


def targets_in(spans: list[tuple[int, int]], offsets: list[tuple[int, int]]) -> list[bool]:
    """Which tokens (by their character ``offsets``) start inside one of ``spans``: the assistant's tokens."""
    return [any(lo <= start < hi for lo, hi in spans) for start, _ in offsets]


def load_tokenizer(path: str | None) -> Tokenizer:
    return ByteTokenizer() if path is None else HFTokenizer(path)


# ChatML, the format of many open chat models: <|im_start|>role\ncontent<|im_end|>\n per message
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as a printable character (what a ByteLevel pre-tokenizer emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def save_byte_tokenizer(folder: str | Path) -> Path:
    """The built-in byte tokenizer as a local HF tokenizer folder (``AutoTokenizer`` loads it): byte b is id b, the
    end-of-document id 256 is ``<|endoftext|>``, and ``<|im_start|>``/``<|im_end|>`` (257, 258) carry a ChatML chat
    template, so a model trained from ``model.config`` can be used, and fine-tuned on chat data, like any HF model."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: b for b, char in _byte_to_unicode().items()}
    backend = RustTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML_TEMPLATE
    tok.save_pretrained(folder)
    return Path(folder)
