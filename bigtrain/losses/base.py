"""What every objective gives the engine: a loss sum, the count it is normalised by, a per-forward term."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class Terms:
    """One micro-batch's contribution to the step's objective."""

    loss_sum: torch.Tensor  # summed over what the objective counts; scaled by 1 / the global batch's count
    # a term each forward computes as a mean over its own tokens (a mixture's router loss): the step adds
    # ``per_forward_weight`` x its mean over every forward of the global batch; None where there is none
    per_forward: torch.Tensor | None = None
    # sums over the micro-batch of the objective's step metrics (``Objective.metric_names``), detached; the engine
    # adds them up over the step's micro-batches and ranks
    metrics: torch.Tensor | None = None


class Objective(Protocol):
    per_forward_weight: float  # the weight of ``Terms.per_forward`` in the step's objective (0: none)
    metric_names: tuple[str, ...]  # what ``Terms.metrics`` sums, in order (empty: the loss is the only metric)

    def count(self, labels: torch.Tensor) -> int:
        """What this micro-batch's loss sum is normalised by (its share of the global batch's count)."""
        ...

    def __call__(self, output: Any, batch: Any) -> Terms:
        """The terms of one micro-batch (``data/batch.py``) from the model's output."""
        ...

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss sum from the model's output tensor alone (a pipeline's last stage hands only that over)."""
        ...

    def eval_sums(self, output: Any, batch: Any, terms: Terms) -> torch.Tensor:
        """Evaluation: the sums over this micro-batch that the objective's metrics are made of (1-D fp32, of a length
        fixed by the model; empty when it reports none beyond the loss), added up over the held-out data and ranks.
        ``terms``: what ``__call__`` gave for the same output (an objective whose step metrics are its evaluation's
        reads them there instead of computing them again)."""
        ...

    def eval_metrics(self, loss: float, sums: torch.Tensor, count: int) -> dict[str, float]:
        """The metrics of a whole evaluation from its mean ``loss``, its ``sums`` and the ``count`` it is over."""
        ...

    def step_metrics(self, sums: torch.Tensor, count: int) -> dict[str, float]:
        """A training step's metrics from its ``Terms.metrics`` summed over the global batch of ``count``."""
        ...


class NoStepMetrics:
    """An objective whose only step metric is its loss."""

    metric_names: tuple[str, ...] = ()

    def step_metrics(self, sums: torch.Tensor, count: int) -> dict[str, float]:
        return {}
