"""Tokenizers: a local HuggingFace tokenizer, or the built-in byte-level one that needs no files."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from bigtrain.config.load import TOKENIZER_FILES, has_tokenizer
from bigtrain.errors import ConfigError


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 plus an end-of-document id 256: no vocabulary file, works on any text."""

    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


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
        self.eos_id = int(self._tok.eos_token_id)
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)


def load_tokenizer(path: str | None) -> Tokenizer:
    return ByteTokenizer() if path is None else HFTokenizer(path)
