"""The classification objective: cross-entropy *summed* over the examples of a micro-batch, which the engine scales
by 1 / (labelled examples of the whole global batch), so that accumulation and data parallelism train exactly what
one forward over the global batch with the mean loss trains (``objectives/causal_lm.py`` says why a sum).
An evaluation filler (label IGNORE_INDEX) adds nothing to the sum or the count."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.objectives.base import Terms


class Classification:
    """One label per example; ``label_smoothing`` as torch's cross-entropy takes it."""

    per_forward_weight = 0.0

    def __init__(self, label_smoothing: float = 0.0) -> None:
        self.label_smoothing = label_smoothing

    def count(self, labels: torch.Tensor) -> int:
        return int((labels != IGNORE_INDEX).sum())

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            logits.float(), labels, reduction="sum", ignore_index=IGNORE_INDEX, label_smoothing=self.label_smoothing
        )

    def __call__(self, output: Any, labels: torch.Tensor) -> Terms:
        return Terms(self.loss_sum(output.logits, labels))
