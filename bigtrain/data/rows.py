"""Token rows: what a causal LM trains on, ``[num_sequences, seq_len]`` ids with what each row predicts, mapped
from a file (the data cache's, a tokenised ``.npy`` or a token ``.bin``) or held in memory."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bigtrain.data.batch import MicroBatch
from bigtrain.data.labels import masked_next_token_labels, next_token_labels


@dataclass
class TokenRows:
    """Token rows plus what they train on and what they were made with (for vocabulary checks and logs)."""

    rows: np.ndarray  # [num_sequences, seq_len], integer ids (a .npy stays memory-mapped)
    vocab_size: int | None  # tokenizer vocabulary, None for pre-tokenised .npy
    description: str
    targets: np.ndarray | None = None  # [num_sequences, seq_len] bool, which tokens are predicted; None: all
    positions: np.ndarray | None = None  # [num_sequences, seq_len] position ids restarting per packed document
    index: np.ndarray | None = None  # the rows of ``rows`` these are (a split of them), in order; None: all
    truncated: int = 0  # records longer than seq_len, cut (packing documents or pad)
    examples: int = 0  # records read (0 for a tokenised .npy)
    cache_note: str | None = None  # where the data cache entry is and whether this start built it
    padded: bool = False  # one example per row, right-padded (data.packing: pad): a micro-batch may be trimmed

    @property
    def seq_len(self) -> int:
        return int(self.rows.shape[1])

    @property
    def num_rows(self) -> int:
        return len(self.rows) if self.index is None else len(self.index)

    def micro_batch(self, rows: np.ndarray, seen: np.ndarray | None = None) -> MicroBatch:
        """Rows ``rows`` (0-based among these) as a host micro-batch with their labels (and position ids when
        documents are packed); ``seen`` (where the rows sit in the global order) changes nothing in token rows."""
        at = rows if self.index is None else self.index[rows]
        ids = torch.from_numpy(np.asarray(self.rows[at], dtype=np.int64))
        labels = next_token_labels(ids) if self.targets is None else masked_next_token_labels(ids, self.targets[at])
        pos = None if self.positions is None else torch.from_numpy(np.asarray(self.positions[at], dtype=np.int64))
        return MicroBatch(ids, labels, pos)
