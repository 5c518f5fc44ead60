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

import torch
import torch.nn.functional as F

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


def per_anchor_losses(anchors: torch.Tensor, candidates: torch.Tensor, scale: float) -> tuple[torch.Tensor, ...]:
    """Each anchor's cross-entropy of its own positive (candidate i for anchor i) among all ``candidates``, and
    whether its positive scores highest (1.0 / 0.0), both [anchors]."""
    scores = scale * F.normalize(anchors.float(), dim=-1) @ F.normalize(candidates.float(), dim=-1).T
    labels = torch.arange(anchors.shape[0], device=anchors.device)
    losses = F.cross_entropy(scores, labels, reduction="none")
    correct = (scores.detach().argmax(-1) == labels).float()
    return losses, correct
