"""What image and text examples share: a subset of them by index (a held-out split), and labels as class indices."""

from __future__ import annotations

from typing import Any

import numpy as np

from bigtrain.errors import ConfigError


class IndexedExamples:
    """Examples with one label each (``labels``), of which ``index`` says which are these (None: all, in order)."""

    labels: np.ndarray
    index: np.ndarray | None

    seq_len = 1  # one example per row (what the loop's per-row counts read)
    positions = None  # nothing is packed

    @property
    def num_rows(self) -> int:
        return len(self.labels) if self.index is None else len(self.index)

    @property
    def examples(self) -> int:
        return self.num_rows

    def in_classes(self, names: list[str], key: str) -> Any:
        """These examples with their labels as indices of ``names`` (the training data's classes), which may be
        more than theirs: a held-out set often lacks a rare class. A class of theirs outside ``names`` is refused
        (the model has no output for it)."""
        from dataclasses import replace

        mine: list[str] = self.class_names  # type: ignore[attr-defined]
        unknown = [name for name in mine if name not in names]
        if unknown:
            raise ConfigError(
                f"{key} has the classes {unknown} that data.path has not ({names}); the model has no output for "
                "them: evaluate on the classes trained on"
            )
        index = {name: i for i, name in enumerate(names)}
        mapping = np.array([index[name] for name in mine], dtype=np.int64)
        return replace(self, labels=mapping[self.labels], class_names=list(names))  # type: ignore[type-var]

    def at(self, rows: np.ndarray) -> np.ndarray:
        """The examples' own indices of ``rows`` (0-based among these)."""
        return rows if self.index is None else self.index[rows]


def label_indices(raw: list[Any], key: str, field: str) -> tuple[list[str], np.ndarray]:
    """Labels as class indices: integers as they are (classes named by their number), names in sorted order."""
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in raw):
        count = max(raw) + 1
        if min(raw) < 0:
            raise ConfigError(f"{key}: {field} holds the label {min(raw)}; labels are class indices from 0")
        return [str(i) for i in range(count)], np.array(raw, dtype=np.int64)
    if all(isinstance(v, str) for v in raw):
        classes = sorted(set(raw))
        lookup = {c: i for i, c in enumerate(classes)}
        return classes, np.array([lookup[v] for v in raw], dtype=np.int64)
    kinds = sorted({type(v).__name__ for v in raw})
    raise ConfigError(f"{key}: {field} holds {', '.join(kinds)} values; labels are class names or class indices")
