"""In-batch negatives across micro-batches and data-parallel ranks: the step's pass before its forwards with a graph
(``losses/contrastive.py`` says why).

``cached_gradients`` takes the step's embeddings, computed without a graph (each micro-batch's rows in blocks of m:
its anchors, their positives, then each column of hard negatives), gathers every rank's, computes the contrastive
loss of the whole global batch on every rank alike (a [global anchors, global candidates] score matrix: small beside
a forward), and returns each local micro-batch's share of it with the gradient of the global loss sum with respect to
its rows' embeddings. The forwards with a graph that follow backpropagate those gradients (their dot product with the
rows' embeddings), which is the gradient of the global loss with respect to the parameters, each rank's part of it;
the engine's gradient reduction adds the ranks' parts as for any loss summed over the global batch.

A step of one micro-batch per rank needs no cache (GradCache is what lets the global batch outgrow one forward): its
forward with a graph scores the rank's anchors against every rank's candidates gathered with their graph
(``WholeStep``), with no pass before it (the cache's pass adds a third to the step's compute). The planner weighs the
two: a micro-batch of the rank's whole share, or smaller ones and the cache (``planner/embedding_plan.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.engine.base import Engine, Reference
from bigtrain.losses.contrastive import WholeStep, per_anchor_losses


@dataclass(frozen=True)
class CachedStep:
    """What one micro-batch gets of its step's global loss: d(global loss sum)/d(its rows' embeddings), in its rows'
    order, and its anchors' loss sum and count of positives ranked first (detached)."""

    gradients: torch.Tensor  # [columns x m, width] fp32
    loss_sum: torch.Tensor  # [] fp32
    correct: torch.Tensor  # [] fp32
    rng: Any = None  # the random state before the pass's forward of it (``engine.base.replaying``)


def _gather(local: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Every rank's ``local`` end to end, in rank order (the same shape on every rank)."""
    if group is None or dist.get_world_size(group) == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local.contiguous(), group=group)
    return torch.cat(parts)


def gathered(
    embedded: list[torch.Tensor], keep: list[torch.Tensor], columns: int, group: dist.ProcessGroup | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's embeddings of every rank as [columns, global examples, width] fp32 (rank after rank, each rank's
    micro-batches in order) and which examples count ([global examples] fp32, 1 or 0)."""
    sizes = [k.shape[0] for k in keep]
    blocks = [e.detach().float().view(columns, m, -1) for e, m in zip(embedded, sizes, strict=True)]
    local = torch.stack([torch.cat([b[c] for b in blocks]) for c in range(columns)])  # [columns, M, width]
    everyone = _gather(local.transpose(0, 1).contiguous(), group).transpose(0, 1)
    return everyone, _gather(torch.cat(keep).float(), group)


def cached_gradients(
    embedded: list[torch.Tensor],
    keep: list[torch.Tensor],
    columns: int,
    scale: float,
    group: dist.ProcessGroup | None = None,
    everyone: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[CachedStep]:
    """The step's micro-batches' shares of the global contrastive loss (``embedded[b]``: micro-batch b's [columns x
    m_b, width] embeddings; ``keep[b]``: [m_b] bool, the examples that count, whose candidates alone are scored;
    every rank has the same m_b). ``everyone``: ``gathered``'s result where the caller has it already."""
    sizes = [k.shape[0] for k in keep]
    together, kept = everyone if everyone is not None else gathered(embedded, keep, columns, group)
    leaves = together.detach().requires_grad_()
    absent = (kept == 0).repeat(columns - 1)  # an evaluation filler's candidates are no one's
    with torch.enable_grad():  # (an evaluation's pass runs without a graph around it)
        anchors, candidates = leaves[0], leaves[1:].reshape(-1, leaves.shape[-1])
        losses, correct = per_anchor_losses(anchors, candidates, scale, absent=absent)
        (losses.masked_fill(kept == 0, 0.0)).sum().backward()
    rank = dist.get_rank(group) if group is not None else 0
    mine = slice(rank * sum(sizes), (rank + 1) * sum(sizes))
    losses = losses.detach().masked_fill(kept == 0, 0.0)  # a filler's own loss (its positive masked: inf) is none
    grads, losses, correct = leaves.grad[:, mine], losses[mine], (correct * kept)[mine]
    out, start = [], 0
    for m in sizes:
        rows = slice(start, start + m)
        out.append(CachedStep(grads[:, rows].reshape(columns * m, -1), losses[rows].sum(), correct[rows].sum()))
        start += m
    return out


def _random_state(batch: Any) -> tuple[Any, ...]:
    """The random state a forward of ``batch`` starts from (the CPU's, and its devices')."""
    from torch.utils.checkpoint import get_device_states

    return (torch.get_rng_state(), *get_device_states(batch.input_ids))


class InBatchNegatives(Reference):
    """The role of ``train.objective: contrastive``: before a step's forwards, its micro-batches embedded without a
    graph (in training mode, each forward's random state kept for the forward with a graph), and each given its
    ``CachedStep`` of the global batch gathered over the engine's data-parallel ranks. In an evaluation every rank's
    held-out embeddings go to the objective too, which ranks each anchor among all of them
    (``losses.contrastive.InBatchNegatives.held_out``)."""

    def __init__(self, engine: Engine, scale: float, objective: Any) -> None:
        self.engine, self.scale, self.objective = engine, scale, objective

    def attach(self, batch: Any) -> Any:
        return self.attach_step([batch])[0]

    def attach_step(self, micro_batches: list[Any]) -> list[Any]:
        training = any(part.training for part in self.engine.built.parts)
        if training and len(micro_batches) == 1:  # nothing to cache: the forward with a graph computes the loss
            return [micro_batches[0].with_cached(self._whole_step(micro_batches[0]))]
        embedded, states = [], []
        with torch.no_grad():
            for batch in micro_batches:
                states.append(_random_state(batch))
                embedded.append(self.objective.embed(self.engine.model_output(batch), batch))
        keep = [batch.labels != IGNORE_INDEX for batch in micro_batches]
        columns = micro_batches[0].columns
        everyone = gathered(embedded, keep, columns, self.engine.batch_group)
        if not training:  # an evaluation's chunk of the held-out pairs, kept on the host until all are embedded
            together, kept = everyone
            self.objective.held_out.append(together[:, kept.bool()].cpu())
            self.objective.device = together.device
        steps = cached_gradients(embedded, keep, columns, self.scale, self.engine.batch_group, everyone)
        return [
            batch.with_cached(replace(step, rng=state))
            for batch, step, state in zip(micro_batches, steps, states, strict=True)
        ]

    def _whole_step(self, batch: Any) -> WholeStep:
        group = self.engine.batch_group
        if group is None or dist.get_world_size(group) == 1:
            return WholeStep(lambda local: local, 0)
        first = dist.get_rank(group) * batch.labels.shape[0]
        return WholeStep(lambda local: _GatherWithGraph.apply(local, group), first)


class _GatherWithGraph(torch.autograd.Function):
    """Every rank's tensor end to end along dim 0 (the same shape on every rank); backward: each rank's gradient of
    the whole, summed over the ranks (an all-reduce: gloo has no reduce-scatter, and a gradient here is small), this
    rank's rows of it. torch's own differentiable all_gather is deprecated, and on 2 gloo ranks it gave each rank the
    gradient of other rows than its own here (the gathered tensor is transposed after the gather)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group, ctx.rows = group, local.shape[0]
        return _gather(local, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.narrow(0, dist.get_rank(ctx.group) * ctx.rows, ctx.rows), None
