"""The preference objectives: DPO (sigmoid or hinge), IPO, ORPO and SimPO on prompt/chosen/rejected pairs.

A micro-batch holds m pairs as 2m rows, the m chosen answers then their m rejected answers (``data/batch.PairBatch``),
each labelled on its answer only. A sequence's log-probability is the sum of its answer tokens' log-probabilities
(DPO, IPO) or their mean (ORPO, SimPO, which compare lengths fairly without a reference). Each objective's loss is a
*sum over the micro-batch's pairs*; the engine scales it by 1 / (pairs of the whole global batch), so accumulation and
data parallelism train what one loop over the global batch with the mean loss per pair trains.

The formulas, per pair, with c/r the chosen/rejected log-probabilities of the policy and c0/r0 of the reference
(log-probabilities precomputed or from the reference model, ``roles/reference.py``), n the answer lengths:
- dpo, sigmoid (Rafailov et al. 2023; ``label_smoothing`` e: conservative DPO): -(1-e) log s(b d) - e log s(-b d),
  d = (c - c0) - (r - r0); hinge (SLiC): max(0, 1 - b d);
- ipo (Azar et al. 2023, length-normalised as TRL's, confirmed with its authors): ((c-c0)/n_c - (r-r0)/n_r - 1/(2b))^2;
- simpo (Meng et al. 2024): -log s(b (c/n_c - r/n_r) - gamma);
- orpo (Hong et al. 2024): -c/n_c - b log s(log odds(c/n_c) - log odds(r/n_r)), odds(p) = e^p / (1 - e^p) (p kept
  at most 1e-6 below 0, where 1 - e^p would vanish);
Metrics (TRL's names): rewards/chosen and rewards/rejected (b (c - c0) for dpo/ipo, b c/n_c for orpo/simpo),
rewards/margins, rewards/accuracies (chosen reward above rejected), logps/chosen and logps/rejected (sums for
dpo/ipo, means for orpo/simpo, as TRL's trainers for each log them), means over the global batch's pairs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bigtrain.data.batch import PairBatch
from bigtrain.data.labels import IGNORE_INDEX, token_logps
from bigtrain.losses.base import Terms
from bigtrain.losses.causal_lm import router_loss

# what a step's metric sums are, in order (each a sum over pairs; divided by the global batch's pairs)
SUMMED = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "logps/chosen", "logps/rejected")


@dataclass(frozen=True)
class PairLogps:
    """One micro-batch's pairs as a preference loss reads them: the policy's chosen and rejected log-probabilities
    (sums, or means per answer token where the objective averages), their ratios to the reference's (None without
    one) and the answers' lengths."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_ratio: torch.Tensor | None
    rejected_ratio: torch.Tensor | None
    chosen_len: torch.Tensor
    rejected_len: torch.Tensor


@dataclass(frozen=True)
class PreferenceSettings:
    """A preference objective as its spec makes it (``bigtrain/objectives``): its per-pair loss, whether it measures
    against a reference and whether it averages log-probabilities per answer token, and the recipe's numbers."""

    pair_loss: Callable[[PairLogps, PreferenceSettings], torch.Tensor]
    needs_reference: bool
    averaged: bool  # a sequence's log-probability is its mean per answer token (orpo, simpo), not its sum
    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5


def dpo_loss(p: PairLogps, s: PreferenceSettings) -> torch.Tensor:
    """DPO: -(1-e) log s(b d) - e log s(-b d), d the margin of the ratios (sigmoid), or SLiC's max(0, 1 - b d)."""
    assert p.chosen_ratio is not None and p.rejected_ratio is not None
    margin = s.beta * (p.chosen_ratio - p.rejected_ratio)
    if s.loss_type == "hinge":
        return torch.relu(1 - margin)
    ls = s.label_smoothing
    return -(1 - ls) * F.logsigmoid(margin) - ls * F.logsigmoid(-margin)


def ipo_loss(p: PairLogps, s: PreferenceSettings) -> torch.Tensor:
    """IPO, length-normalised as TRL's: ((c-c0)/n_c - (r-r0)/n_r - 1/(2b))^2."""
    assert p.chosen_ratio is not None and p.rejected_ratio is not None
    gap = p.chosen_ratio / p.chosen_len - p.rejected_ratio / p.rejected_len
    return (gap - 1 / (2 * s.beta)) ** 2


def simpo_loss(p: PairLogps, s: PreferenceSettings) -> torch.Tensor:
    """SimPO: -log s(b (c - r) - gamma) of the mean log-probabilities."""
    return -F.logsigmoid(s.beta * (p.chosen - p.rejected) - s.simpo_gamma)


def orpo_loss(p: PairLogps, s: PreferenceSettings) -> torch.Tensor:
    """ORPO: the chosen answer's mean NLL plus the weighted odds-ratio term."""
    return -p.chosen - s.beta * F.logsigmoid(log_odds(p.chosen) - log_odds(p.rejected))


# log(1 - e^p) is -inf at p = 0 (an answer the model is certain of: in fp32, any |p| below ~6e-8): the odds are taken
# at most this close to certainty, which leaves every answer's odds ratio finite and its gradient defined
CERTAIN = -1e-6


def log_odds(mean_logp: torch.Tensor) -> torch.Tensor:
    """log(p / (1 - p)) of a mean log-probability, stable near both ends (expm1 near certainty)."""
    x = mean_logp.clamp(max=CERTAIN)
    return x - torch.where(x > -0.693, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the sum of its labelled tokens' log-probabilities (fp32) and how many there are."""
    return token_logps(logits, labels).sum(1), (labels != IGNORE_INDEX).sum(1)


# train.compile: the token log-probabilities through inductor, as the causal-LM loss (losses/causal_lm.py), so a
# compiled run keeps the compute-dtype logits and one log-sum-exp per row for backward, not fp32 copies of them
def compiled_sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _compiled_token_logps()(logits, labels).sum(1), (labels != IGNORE_INDEX).sum(1)


@functools.cache
def _compiled_token_logps() -> Any:
    return torch.compile(token_logps)


class Preference:
    """A preference objective (``PreferenceSettings``: its spec's) over a ``PairBatch``; a mixture's router
    loss joins it as it joins the causal-LM loss (``router_weight``: the config's coefficient, 0: none);
    ``compiled``: the token log-probabilities through inductor (train.compile)."""

    metric_names = SUMMED

    def __init__(self, settings: PreferenceSettings, router_weight: float = 0.0, compiled: bool = False) -> None:
        self.settings = settings
        self.per_forward_weight = router_weight
        self.logps = compiled_sequence_logps if compiled else sequence_logps

    def count(self, labels: torch.Tensor) -> int:
        """The pairs of a micro-batch (an evaluation filler pair has no label and counts nothing)."""
        chosen = labels[: labels.shape[0] // 2]
        return int((chosen != IGNORE_INDEX).any(1).sum())

    def pair_terms(self, logits: torch.Tensor, batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-pair losses, the metric sums of ``SUMMED``) of one micro-batch; a filler pair adds nothing."""
        s = self.settings
        logps, lengths = self.logps(logits, batch.labels)
        pairs = logps.shape[0] // 2
        real = lengths[:pairs] > 0
        lengths = lengths.clamp(min=1).float()
        if s.averaged:
            logps = logps / lengths
        c, r = logps[:pairs], logps[pairs:]
        chosen_ratio = rejected_ratio = None
        if s.needs_reference:
            assert batch.ref_logps is not None, "this objective needs the reference's log-probabilities (roles/)"
            ref = batch.ref_logps.to(logps.dtype)
            chosen_ratio, rejected_ratio = c - ref[:pairs], r - ref[pairs:]
            rewards = s.beta * chosen_ratio.detach(), s.beta * rejected_ratio.detach()
        else:
            rewards = s.beta * c.detach(), s.beta * r.detach()
        loss = s.pair_loss(PairLogps(c, r, chosen_ratio, rejected_ratio, lengths[:pairs], lengths[pairs:]), s)
        keep = real.to(loss.dtype)
        chosen_reward, rejected_reward = rewards
        sums = torch.stack(
            [
                (chosen_reward * keep).sum(),
                (rejected_reward * keep).sum(),
                ((chosen_reward > rejected_reward).to(keep.dtype) * keep).sum(),
                (c.detach() * keep).sum(),
                (r.detach() * keep).sum(),
            ]
        )
        return loss * keep, sums

    def __call__(self, output: Any, batch: PairBatch) -> Terms:
        losses, sums = self.pair_terms(output.logits, batch)
        return Terms(losses.sum(), router_loss(output) if self.per_forward_weight else None, sums)

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a pipeline schedule hands the loss only logits: preference objectives need pp=1")

    def eval_sums(self, output: Any, batch: PairBatch, terms: Terms) -> torch.Tensor:
        assert terms.metrics is not None, "terms from this objective's __call__"
        return terms.metrics  # the step metrics' sums are the evaluation's

    def eval_metrics(self, loss: float, sums: torch.Tensor, count: int) -> dict[str, float]:
        return {f"eval_{k}": v for k, v in step_metrics(sums, count).items()} | {"eval_pairs": count}

    def step_metrics(self, sums: torch.Tensor, count: int) -> dict[str, float]:
        return step_metrics(sums, count)


def step_metrics(sums: torch.Tensor, count: int) -> dict[str, float]:
    """TRL's metric names from the summed ``SUMMED`` over ``count`` pairs (margins: chosen minus rejected)."""
    means = {name: float(v) / max(count, 1) for name, v in zip(SUMMED, sums.tolist(), strict=True)}
    means["rewards/margins"] = means["rewards/chosen"] - means["rewards/rejected"]
    return means
