"""The GRPO family's loss on generated completions (``train.objective: grpo``), as TRL 1.16's ``GRPOTrainer`` has it.

For each completion token t of completion i, with A_i the completion's advantage (``roles/rollout.py``), pi the
policy's log-probability of the token, pi_old the generating policy's and pi_ref the reference's (all of softmax(logits
/ temperature)):
- the importance weight w = exp(pi - pi_old) per token, or GSPO's exp(mean over the completion's tokens of
  pi - pi_old) per completion (``importance_sampling_level: sequence``);
- the clipped surrogate -min(w A_i, clip(w, 1 - epsilon, 1 + epsilon_high) A_i) (PPO's, DAPO's asymmetric clip);
- plus beta times the KL estimator exp(pi_ref - pi) - (pi_ref - pi) - 1 (Schulman's k3, as TRL) when beta > 0.

How the token losses are summed and what normalises them (``train.loss_type``), over the global batch as every
bigtrain objective: dapo, their sum over the global batch's completion tokens; grpo, each completion's mean over its
tokens, summed, over the global batch's completions; dr_grpo, their sum over completions x max_completion_length.
These equal TRL's on any plan. bnpo is TRL's per-micro-batch normalisation (each micro-batch's sum over its own
tokens, averaged over the micro-batches): it depends on the micro-batch size by definition, as TRL's does.

Metrics (TRL's names): ``kl`` (the estimator's mean over completion tokens), ``clip_ratio/low_mean``,
``clip_ratio/high_mean``, ``clip_ratio/region_mean`` (the share of tokens whose ratio was clipped where it mattered)
and ``entropy`` (the mean entropy of the policy's next-token distribution over completion tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bigtrain.config.online_rl import GRPO_LOSSES
from bigtrain.data.labels import IGNORE_INDEX, token_logps
from bigtrain.losses.base import Terms

# train.loss_type's normalisations: by completion tokens, completions, completions x max length, micro-batch tokens
BY_TOKENS, BY_COMPLETIONS, BY_MAX_LENGTH, BY_MICRO_BATCH_TOKENS = (GRPO_LOSSES[2], GRPO_LOSSES[0], *GRPO_LOSSES[1::2])
SUMMED = ("kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "entropy")


@dataclass(frozen=True)
class GrpoSettings:
    beta: float
    epsilon_low: float
    epsilon_high: float
    loss_type: str  # dapo | grpo | dr_grpo | bnpo
    sequence_level: bool  # importance_sampling_level: sequence (GSPO)
    max_completion_length: int
    temperature: float


ENTROPY_CHUNK_LOGITS = 2**22  # the entropy metric's fp32 work, at most 16 MiB per tensor at a time


def entropy_sum(logits: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """The entropy of softmax(logits / temperature) summed over the labelled positions, without a graph, a chunk of
    positions at a time: the distribution is a metric's, so its fp32 copies never rival the loss's (a whole row's
    would: 16 bytes per logit while the loss's graph is alive). Masked by multiplying, not by indexing: a boolean
    index has a data-dependent shape, which the planner's simulated step on fake tensors cannot follow."""
    flat, keep = logits.detach().flatten(0, -2), mask.flatten().to(torch.float32)
    chunk = max(1, ENTROPY_CHUNK_LOGITS // flat.shape[-1])
    total = torch.zeros((), device=logits.device)
    with torch.no_grad():
        for start in range(0, flat.shape[0], chunk):
            logp = torch.log_softmax(flat[start : start + chunk].float() / temperature, dim=-1)
            total += (-(logp.exp() * logp).sum(-1) * keep[start : start + chunk]).sum()
    return total


class Grpo:
    """The loss over a ``data/rollout_batch.RolloutBatch`` from the policy's logits."""

    per_forward_weight = 0.0
    metric_names = (*SUMMED, "tokens")

    def __init__(self, settings: GrpoSettings) -> None:
        self.s = settings

    def count(self, labels: torch.Tensor) -> int:
        """What normalises a micro-batch's sum (its share of the global batch's count), by ``loss_type``."""
        completions = labels.shape[0]
        if self.s.loss_type == BY_TOKENS:
            return int((labels != IGNORE_INDEX).sum())
        if self.s.loss_type == BY_COMPLETIONS:
            return completions
        if self.s.loss_type == BY_MAX_LENGTH:
            return completions * self.s.max_completion_length
        return 1  # bnpo: each micro-batch's own mean, averaged over the micro-batches

    def token_losses(self, logits: torch.Tensor, batch: Any) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """[rows, length] per-token loss, the completion mask, and what the metrics read."""
        s = self.s
        mask = (batch.labels != IGNORE_INDEX).float()
        logps = token_logps(logits, batch.labels, s.temperature)
        old = logps.detach() if batch.old_logps is None else batch.old_logps
        log_ratio = (logps - old) * mask
        if s.sequence_level:
            log_ratio = (log_ratio.sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        weight = torch.exp(log_ratio)
        clipped = torch.clamp(weight, 1 - s.epsilon_low, 1 + s.epsilon_high)
        advantages = batch.advantages.float().unsqueeze(1)
        losses = -torch.min(weight * advantages, clipped * advantages)
        kl = None
        if s.beta != 0.0:
            assert batch.ref_logps is not None, "beta > 0: the engine's reference fills ref_logps"
            gap = batch.ref_logps - logps
            kl = torch.exp(gap) - gap - 1
            losses = losses + s.beta * kl
        seen = {"weight": weight.detach(), "advantages": advantages, "kl": kl}
        return losses * mask, mask, seen

    def __call__(self, output: Any, batch: Any) -> Terms:
        logits = output.logits
        losses, mask, seen = self.token_losses(logits, batch)
        loss_type = self.s.loss_type
        if loss_type == BY_COMPLETIONS:
            loss = (losses.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum()
        elif loss_type == BY_MICRO_BATCH_TOKENS:
            loss = losses.sum() / mask.sum().clamp(min=1.0)
        else:  # dapo, dr_grpo: the count differs, not the sum
            loss = losses.sum()
        return Terms(loss, None, self._metric_sums(logits, mask, seen))

    def _metric_sums(self, logits: torch.Tensor, mask: torch.Tensor, seen: dict[str, Any]) -> torch.Tensor:
        weight, advantages = seen["weight"].expand_as(mask), seen["advantages"]
        low = ((weight < 1 - self.s.epsilon_low) & (advantages < 0)).float() * mask
        high = ((weight > 1 + self.s.epsilon_high) & (advantages > 0)).float() * mask
        kl = torch.zeros((), device=mask.device) if seen["kl"] is None else (seen["kl"].detach() * mask).sum()
        entropy = entropy_sum(logits.detach(), mask, self.s.temperature)
        region = torch.maximum(low, high)
        return torch.stack([kl, low.sum(), high.sum(), region.sum(), entropy, mask.sum()])

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a pipeline schedule hands the loss only logits: grpo trains with pp=1")

    def eval_sums(self, output: Any, batch: Any, terms: Terms) -> torch.Tensor:
        return torch.zeros(0, device=batch.labels.device)

    def eval_metrics(self, loss: float, sums: torch.Tensor, count: int) -> dict[str, float]:
        return {}

    def step_metrics(self, sums: torch.Tensor, count: int) -> dict[str, float]:
        *values, tokens = sums.tolist()
        metrics = {name: v / max(tokens, 1.0) for name, v in zip(SUMMED, values, strict=True)}
        if self.s.beta == 0.0:
            del metrics["kl"]
        return metrics
