"""Preference pairs as a reward model reads them (``model.task: reward-model``): each answer one row of its prompt and
answer, scored once by the model's head at the row's last token.

The pairs are the preference objectives' own (``data/preference.py``: the same records, tokenisation and data cache);
only the micro-batch differs. A score head reads the last token that is not padding (transformers' sequence
classifiers find it by ``config.pad_token_id``), so each row is padded after its answer with the tokenizer's pad id
(else its eos id, as TRL's ``RewardTrainer`` pads) and carries an attention mask (an encoder's padding must not be
attended to). A micro-batch of m pairs is 2m rows, the m chosen then the m rejected, with each pair's margin.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.data.preference import PreferencePairs


@dataclass(frozen=True)
class RewardBatch:
    """m pairs: 2m right-padded rows (chosen, then rejected) with their attention mask; per pair its margin (TRL's
    ``margin``, 0 without one) and a label that is 0, or IGNORE_INDEX for an evaluation filler (it counts nothing)."""

    input_ids: torch.Tensor  # [2m, length]
    attention_mask: torch.Tensor  # [2m, length]
    margins: torch.Tensor  # [m] fp32
    labels: torch.Tensor  # [m] int64

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}

    def to(self, device: torch.device) -> RewardBatch:
        return RewardBatch(*(t.to(device, non_blocking=True) for t in self.tensors()))

    def pin_memory(self) -> RewardBatch:
        return RewardBatch(*(t.pin_memory() for t in self.tensors()))

    def tensors(self) -> list[torch.Tensor]:
        return [self.input_ids, self.attention_mask, self.margins, self.labels]

    def without_labels(self, rows: torch.Tensor) -> RewardBatch:
        """The pairs where ``rows`` ([m] bool) is set count nothing (evaluation fillers)."""
        return replace(self, labels=self.labels.masked_fill(rows, IGNORE_INDEX))


@dataclass
class RewardPairs(PreferencePairs):
    """``PreferencePairs`` read as ``RewardBatch``es (a split of them, ``subset``, stays one)."""

    @classmethod
    def of(cls, pairs: PreferencePairs) -> RewardPairs:
        return cls(**{f.name: getattr(pairs, f.name) for f in fields(pairs)})

    @property
    def seq_len(self) -> int:
        """One answer per row counted (throughput counts answers scored; rows are as long as their longest answer)."""
        return 1

    def micro_batch(self, rows: np.ndarray, seen: np.ndarray | None = None) -> RewardBatch:
        """Pairs ``rows``: their chosen rows, then their rejected rows, each through its answer's last token, padded
        after it with the pad id to the longest of them."""
        at = self.at(rows)
        targets = np.concatenate([self.targets[at, 0], self.targets[at, 1]])
        lengths = targets.shape[1] - np.argmax(targets[:, ::-1], axis=1)
        width = int(lengths.max())
        ids = np.concatenate([self.ids[at, 0, :width], self.ids[at, 1, :width]]).astype(np.int64)
        mask = np.arange(width)[None, :] < lengths[:, None]
        ids[~mask] = self.pad_id
        margin = np.zeros(len(at), np.float32) if self.margins is None else np.asarray(self.margins[at], np.float32)
        return RewardBatch(
            torch.from_numpy(ids),
            torch.from_numpy(mask.astype(np.int64)),
            torch.from_numpy(margin),
            torch.zeros(len(at), dtype=torch.int64),
        )


def read_reward_pairs(cfg: Any, hf_config: Any) -> tuple[RewardPairs, RewardPairs | None]:
    """The pairs of ``data.path`` and the held-out ones (``data.eval_path`` or ``data.eval_fraction``) as a reward
    model reads them."""
    from bigtrain.data.preference import read_pairs_and_held_out

    data, held = read_pairs_and_held_out(cfg, hf_config)
    return RewardPairs.of(data), None if held is None else RewardPairs.of(held)
