"""The Bradley-Terry loss of a reward model on preference pairs (``train.objective: reward``).

Each pair's answers are scored by the model's one-output head, r_c and r_r; its loss is -log s(r_c - r_r - m), m the
pair's margin (TRL's ``margin`` field, 0 without one), plus TRL's ``center_rewards_coefficient`` c times
(r_c + r_r)^2, which keeps the rewards centred on 0 (Eisenstein et al. 2023). The loss is a *sum over the micro-batch's
pairs*; the engine scales it by 1 / (pairs of the whole global batch), so accumulation and data parallelism train what
one loop over the global batch with the mean loss per pair trains (TRL's ``RewardTrainer`` on one batch).

Metrics (TRL's names): ``accuracy`` (chosen scored above rejected), ``margin`` (r_c - r_r) and ``mean_reward``, means
over the global batch's pairs; the same on held-out pairs as ``eval_*``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.losses.base import Terms

SUMMED = ("accuracy", "margin", "mean_reward")


class BradleyTerry:
    """The pair loss over a ``data/reward_pairs.RewardBatch`` from the model's scores ([2m, 1] logits)."""

    per_forward_weight = 0.0
    metric_names = SUMMED

    def __init__(self, center_rewards_coefficient: float = 0.0) -> None:
        self.center = center_rewards_coefficient

    def count(self, labels: torch.Tensor) -> int:
        """The pairs of a micro-batch (an evaluation filler counts nothing)."""
        return int((labels != IGNORE_INDEX).sum())

    def __call__(self, output: Any, batch: Any) -> Terms:
        scores = output.logits.float().squeeze(-1)
        pairs = scores.shape[0] // 2
        chosen, rejected = scores[:pairs], scores[pairs:]
        loss = -F.logsigmoid(chosen - rejected - batch.margins.float())
        if self.center:
            loss = loss + self.center * (chosen + rejected) ** 2
        keep = (batch.labels != IGNORE_INDEX).to(loss.dtype)
        c, r = chosen.detach(), rejected.detach()
        sums = torch.stack([((c > r).to(keep.dtype) * keep).sum(), ((c - r) * keep).sum(), ((c + r) / 2 * keep).sum()])
        return Terms((loss * keep).sum(), None, sums)

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a pipeline schedule hands the loss only logits: a reward model trains with pp=1")

    def eval_sums(self, output: Any, batch: Any, terms: Terms) -> torch.Tensor:
        assert terms.metrics is not None, "terms from this objective's __call__"
        return terms.metrics  # the step metrics' sums are the evaluation's

    def eval_metrics(self, loss: float, sums: torch.Tensor, count: int) -> dict[str, float]:
        return {f"eval_{k}": v for k, v in self.step_metrics(sums, count).items()} | {"eval_pairs": count}

    def step_metrics(self, sums: torch.Tensor, count: int) -> dict[str, float]:
        return {name: float(v) / max(count, 1) for name, v in zip(SUMMED, sums.tolist(), strict=True)}
