"""What the datasets of whole token rows share (preference pairs, image conversations): rows kept as arrays once,
a split of them by index (a held-out part), and a fingerprint of what they hold."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import numpy as np


class IndexedRows:
    """``ids`` and ``targets`` with one entry per example; ``index`` says which examples these are (None: all)."""

    ids: np.ndarray
    targets: np.ndarray
    index: np.ndarray | None

    @property
    def num_rows(self) -> int:
        return len(self.ids) if self.index is None else len(self.index)

    def at(self, rows: np.ndarray) -> np.ndarray:
        """The examples' own indices of ``rows`` (0-based among these)."""
        return rows if self.index is None else self.index[rows]

    def fingerprint(self) -> str:
        """The tokens and targets of every example, in order (what a precomputed pass or a resume is checked by)."""
        at = np.arange(len(self.ids)) if self.index is None else self.index
        digest = hashlib.sha256(np.ascontiguousarray(self.ids[at]).tobytes())
        digest.update(np.ascontiguousarray(self.targets[at]).tobytes())
        return digest.hexdigest()[:16]

    def subset(self, index: np.ndarray, description: str) -> Any:
        return replace(self, index=index if self.index is None else self.index[index], description=description)
