"""How a recipe field is declared: its documentation and its spelling in YAML."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def doc(text: str, key: str | None = None, **kwargs: Any) -> Any:
    """A dataclass field carrying its user-facing documentation (shown in errors and the README reference);
    ``key`` is the recipe's spelling where it cannot be the field's name (``async`` is a Python keyword)."""
    metadata = {"doc": text} if key is None else {"doc": text, "key": key}
    return field(metadata=metadata, **kwargs)


def recipe_key(f: Any) -> str:
    """The recipe (YAML) name of a dataclass field."""
    return f.metadata.get("key", f.name)
