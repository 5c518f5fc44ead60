"""The contrastive loss of an embedding model over in-batch negatives (``train.objective: contrastive``).

Each example is an anchor, its positive and ``n`` optional hard negatives, embedded by the model and pooled (mean over
the tokens, the first token, or the last one). Every anchor is scored against every candidate of the *global* batch
(all positives, then all hard negatives), by cosine similarity times ``scale`` (1 / temperature;
sentence-transformers' ``MultipleNegativesRankingLoss`` uses 20), and its loss is the cross-entropy of its own
positive among them. The loss is a *sum over anchors*; the engine scales it by 1 / (anchors of the global batch).

Negatives from other micro-batches and ranks couple the examples, so a step cannot be a sum of independent
micro-batch losses: ``roles/in_batch_negatives.py`` embeds the step's micro-batches without a graph first, gathers the
embeddings of every data-parallel rank, computes the global loss and its gradient with respect to each embedding
(GradCache, Gao et al. 2021), and hands each micro-batch its rows' gradients; the micro-batch's forward with a graph
then backpropagates them (``InBatchNegatives.__call__``), which gives exactly the gradient of one loop over the whole
global batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.losses.base import Terms

POOLING = ("mean", "cls", "last_token")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """One vector per row of ``hidden`` [rows, length, width] (fp32): the mean of the tokens the mask keeps, the first
    kept token (``cls``: left padding safe), or the last kept one (``last_token``: a decoder's)."""
    mask = attention_mask.to(hidden.device)
    if mode == "mean":
        weights = mask.unsqueeze(-1).float()
        return (hidden.float() * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if mode == "cls":
        return hidden[rows, mask.int().argmax(1)].float()
    if mode == "last_token":
        last = mask.shape[1] - 1 - mask.int().flip(1).argmax(1)
        return hidden[rows, last].float()
    raise ValueError(f"pooling {mode!r} is not one of {POOLING}")


def family_pooling(hf_config: Any) -> str:
    """``train.pooling: auto`` for a family: last_token for a decoder (a family transformers serves as a causal LM and
    not as a masked LM: sentence-transformers' default for decoder embedders), else mean."""
    from transformers.models.auto import modeling_auto

    model_type = hf_config.model_type
    decoder = model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
        model_type not in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )
    return "last_token" if decoder else "mean"


def per_anchor_losses(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    scale: float,
    first: int = 0,
    absent: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Each anchor's cross-entropy of its own positive (candidate ``first + i`` for anchor i) among all
    ``candidates``, and whether its positive scores highest (1.0 / 0.0), both [anchors]. ``absent``: [candidates]
    bool, candidates that are no one's (an evaluation's fillers), left out of every anchor's softmax."""
    scores = scale * F.normalize(anchors.float(), dim=-1) @ F.normalize(candidates.float(), dim=-1).T
    if absent is not None:
        scores = scores.masked_fill(absent, float("-inf"))
    labels = first + torch.arange(anchors.shape[0], device=anchors.device)
    losses = F.cross_entropy(scores, labels, reduction="none")
    correct = (scores.detach().argmax(-1) == labels).float()
    return losses, correct


@dataclass(frozen=True)
class WholeStep:
    """A step whose rank holds one micro-batch: its loss is computed in its forward with a graph, no pass before it
    (``roles/in_batch_negatives.py``); ``gather(t)``: every rank's ``t`` end to end along dim 0 with its graph, in
    rank order; ``first``: this rank's first example in the gathered order."""

    gather: Callable[[torch.Tensor], torch.Tensor]
    first: int


TOP = 10  # the ranks MRR and recall look at (sentence-transformers' InformationRetrievalEvaluator's @10)


def retrieval_metrics(
    anchors: torch.Tensor, candidates: torch.Tensor, chunk: int = 1024, device: torch.device | None = None
) -> dict[str, float]:
    """Each anchor's own positive (candidate i for anchor i) ranked by cosine similarity among every candidate:
    the share ranked first (``accuracy``), the mean reciprocal rank within the first TOP (``mrr_at_10``) and the
    share within the first TOP (``recall_at_10``). The candidates on ``device`` (normalised in place of a copy), the
    anchors moved there a chunk at a time, so the device holds [candidates, width] and [chunk, candidates]."""
    candidates = F.normalize(candidates.to(device).float(), dim=-1)
    anchors = anchors.float()
    first = reciprocal = within = 0.0
    for start in range(0, anchors.shape[0], chunk):
        scores = F.normalize(anchors[start : start + chunk].to(candidates.device), dim=-1) @ candidates.T
        rows = torch.arange(scores.shape[0], device=scores.device)
        own = scores[rows, rows + start]
        rank = (scores > own[:, None]).sum(1) + 1  # ties count for the positive
        first += float((rank == 1).sum())
        reciprocal += float(torch.where(rank <= TOP, 1.0 / rank.float(), torch.zeros_like(own)).sum())
        within += float((rank <= TOP).sum())
    n = max(anchors.shape[0], 1)
    return {"accuracy": first / n, f"mrr_at_{TOP}": reciprocal / n, f"recall_at_{TOP}": within / n}


class InBatchNegatives:
    """The loss of a micro-batch of ``data/text_pairs.EmbeddingBatch`` from the model's last hidden states: the
    gradient its step's pass cached for its rows backpropagated through their embeddings, its value its anchors'
    share of the global loss (``roles/in_batch_negatives.py``). Metric: ``accuracy``, the anchors whose own positive
    scores highest among all the candidates."""

    per_forward_weight = 0.0
    metric_names = ("accuracy",)

    def __init__(self, scale: float, pooling: str) -> None:
        self.scale, self.pooling = scale, pooling
        # an evaluation's chunks of held-out embeddings, every rank's ([columns, examples, width], which count),
        # put here by the step's pass (roles/in_batch_negatives.py) and ranked all together by ``eval_metrics``
        self.held_out: list[torch.Tensor] = []
        self.device = torch.device("cpu")  # where the ranking runs: the device the chunks were embedded on

    def count(self, labels: torch.Tensor) -> int:
        """The anchors of a micro-batch (an evaluation filler counts nothing)."""
        return int((labels != IGNORE_INDEX).sum())

    def embed(self, output: Any, batch: Any) -> torch.Tensor:
        """Each row's pooled embedding (fp32)."""
        return pool(output.last_hidden_state, batch.attention_mask, self.pooling)

    def __call__(self, output: Any, batch: Any) -> Terms:
        cached = batch.cached
        assert cached is not None, "the step's pass (roles/in_batch_negatives.py) gives every micro-batch its share"
        embedded = self.embed(output, batch)
        if isinstance(cached, WholeStep):
            return self._whole_step(embedded, batch, cached)
        through = (embedded * cached.gradients.to(embedded.device)).sum()
        # the value: this micro-batch's share of the global loss; the gradient: the cached one through its rows
        loss_sum = through - through.detach() + cached.loss_sum.to(embedded.device)
        return Terms(loss_sum, None, cached.correct.reshape(1).to(embedded.device))

    def _whole_step(self, embedded: torch.Tensor, batch: Any, step: WholeStep) -> Terms:
        """A step of one micro-batch per rank, without the cache: this rank's anchors scored against every rank's
        candidates, gathered with their graph (the backward of the gather adds each rank's gradient of its own
        anchors' losses to the candidates' rows, so the ranks' parameter gradients sum to the global loss's)."""
        m, columns = batch.labels.shape[0], batch.columns
        blocks = embedded.view(columns, m, -1)
        local = blocks[1:].transpose(0, 1).contiguous()  # [m, columns - 1, width]: whole examples, gathered in order
        everyone = step.gather(local).transpose(0, 1)  # [columns - 1, M, width]
        losses, correct = per_anchor_losses(blocks[0], everyone.reshape(-1, everyone.shape[-1]), self.scale, step.first)
        keep = (batch.labels != IGNORE_INDEX).float()
        return Terms((losses * keep).sum(), None, (correct * keep).sum().reshape(1))

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a pipeline schedule hands the loss only logits: an embedding model trains with pp=1")

    def eval_sums(self, output: Any, batch: Any, terms: Terms) -> torch.Tensor:
        assert terms.metrics is not None
        return terms.metrics

    def eval_metrics(self, loss: float, sums: torch.Tensor, count: int) -> dict[str, float]:
        """Retrieval over the whole held-out set: each anchor's positive among every held-out positive and hard
        negative (the eval loss stays the in-batch one, chunk by chunk)."""
        chunks, self.held_out = self.held_out, []
        embedded = torch.cat(chunks, dim=1)  # [columns, held-out examples, width], on the host
        anchors, candidates = embedded[0], embedded[1:].reshape(-1, embedded.shape[-1])
        found = retrieval_metrics(anchors, candidates, device=self.device)
        return {**{f"eval_{k}": v for k, v in found.items()}, "eval_anchors": int(embedded.shape[1])}

    def step_metrics(self, sums: torch.Tensor, count: int) -> dict[str, float]:
        return {"accuracy": float(sums[0]) / max(count, 1)}
