"""The contrastive loss over in-batch negatives and its gradient cache: embedding the step's micro-batches without a
graph, the global loss's gradient with respect to each embedding, then each micro-batch's forward with a graph
backpropagating it gives the gradient of one pass over the whole global batch, on one rank and across two."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bigtrain.losses.contrastive import per_anchor_losses, pool
from bigtrain.roles.in_batch_negatives import cached_gradients

COLUMNS, WIDTH, SCALE = 3, 8, 20.0  # anchor, positive, one hard negative


def _examples(count: int, seed: int = 0) -> torch.Tensor:
    """``count`` examples of COLUMNS feature rows each: [count, COLUMNS, 16]."""
    return torch.randn(count, COLUMNS, 16, generator=torch.Generator().manual_seed(seed))


def _rows(examples: torch.Tensor) -> torch.Tensor:
    """A micro-batch's rows in blocks: its anchors, their positives, their negatives."""
    return examples.transpose(0, 1).reshape(-1, examples.shape[-1])


def _by_hand(encoder: nn.Module, examples: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    """One pass over the whole global batch: the mean loss and its gradient."""
    encoder.zero_grad()
    emb = encoder(examples)  # [count, COLUMNS, WIDTH]
    candidates = emb[:, 1:].transpose(0, 1).reshape(-1, WIDTH)
    losses, _ = per_anchor_losses(emb[:, 0], candidates, SCALE)
    loss = losses.mean()
    loss.backward()
    return float(loss), [p.grad.clone() for p in encoder.parameters()]


def _cached(encoder, micro_batches, count, group=None) -> tuple[float, list[torch.Tensor]]:
    encoder.zero_grad()
    with torch.no_grad():
        embedded = [encoder(_rows(mb)) for mb in micro_batches]
    keep = [torch.ones(mb.shape[0], dtype=torch.bool) for mb in micro_batches]
    steps = cached_gradients(embedded, keep, COLUMNS, SCALE, group)
    for mb, step in zip(micro_batches, steps, strict=True):
        ((encoder(_rows(mb)) * step.gradients).sum() / count).backward()
    return float(sum(s.loss_sum for s in steps)) / count, [p.grad.clone() for p in encoder.parameters()]


def test_the_cached_gradient_of_micro_batches_is_one_pass_s_over_the_global_batch():
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, WIDTH))
    examples = _examples(6)
    loss, grads = _by_hand(encoder, examples)
    cached_loss, cached = _cached(encoder, [examples[:2], examples[2:4], examples[4:]], 6)
    assert abs(loss - cached_loss) < 1e-6
    for g, c in zip(grads, cached, strict=True):
        torch.testing.assert_close(c, g, rtol=1e-5, atol=1e-6)
    # teeth: negatives from each micro-batch alone is another loss and another gradient
    alone = [_by_hand(encoder, examples[i : i + 2]) for i in (0, 2, 4)]
    assert abs(sum(a[0] for a in alone) / 3 - loss) > 10 * 1e-6


def _whole_step(encoder, mine, count, group) -> tuple[float, list[torch.Tensor]]:
    """The rank's one micro-batch without the cache: its anchors against every rank's candidates, gathered with
    their graph in the loss (``losses.contrastive.WholeStep``)."""
    from types import SimpleNamespace

    from bigtrain.losses.contrastive import InBatchNegatives, WholeStep
    from bigtrain.roles.in_batch_negatives import _GatherWithGraph

    encoder.zero_grad()
    m = mine.shape[0]
    step = WholeStep(lambda local: _GatherWithGraph.apply(local, group), dist.get_rank(group) * m)
    batch = SimpleNamespace(labels=torch.zeros(m, dtype=torch.long), columns=COLUMNS)
    terms = InBatchNegatives(SCALE, "mean")._whole_step(encoder(_rows(mine)), batch, step)
    (terms.loss_sum / count).backward()
    return float(terms.loss_sum) / count, [p.grad.clone() for p in encoder.parameters()]


def _rank(rank: int, port: int, examples: torch.Tensor, out: dict, whole: bool = False) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, WIDTH))
    mine = examples[rank * 4 : (rank + 1) * 4]
    if whole:
        loss, grads = _whole_step(encoder, mine, 8, dist.group.WORLD)
    else:
        loss, grads = _cached(encoder, [mine[:2], mine[2:]], 8, dist.group.WORLD)
    for g in grads:
        dist.all_reduce(g)  # each rank's part of the global gradient, added (as a sum-reducing engine does)
    summed = torch.tensor([loss])
    dist.all_reduce(summed)
    out[rank] = (float(summed), grads)
    dist.destroy_process_group()


@pytest.mark.parametrize("pooling", ["mean", "cls", "last_token"])
def test_pooling_reads_the_rows_the_mask_keeps(pooling):
    hidden = torch.arange(2 * 4 * 2, dtype=torch.float32).view(2, 4, 2)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])  # right-padded, then left-padded
    expected = {
        "mean": torch.stack([hidden[0, :3].mean(0), hidden[1, 1:].mean(0)]),
        "cls": torch.stack([hidden[0, 0], hidden[1, 1]]),
        "last_token": torch.stack([hidden[0, 2], hidden[1, 3]]),
    }[pooling]
    torch.testing.assert_close(pool(hidden, mask, pooling), expected)


@pytest.mark.parametrize("whole", [False, True], ids=["cached", "whole-step"])
def test_two_ranks_gather_every_negative_and_their_gradients_add_up_to_one_pass_s(whole):
    """Two micro-batches per rank through the cache, or one per rank scored in its forward against the candidates
    gathered with their graph: either way the ranks' summed gradients are one pass's over the global batch."""
    from helpers import free_port

    examples = _examples(8, seed=1)
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, WIDTH))
    loss, grads = _by_hand(encoder, examples)
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(free_port(), examples, out, whole), nprocs=2)
    for rank in (0, 1):
        assert abs(out[rank][0] - loss) < 1e-6
        for g, c in zip(grads, out[rank][1], strict=True):
            torch.testing.assert_close(c, g, rtol=1e-5, atol=1e-6)


def test_retrieval_ranks_each_anchor_s_positive_among_every_held_out_candidate():
    """Three anchors on the unit circle's axes, candidates placed so the ranks are known: anchor 0's positive first,
    anchor 1's third (behind two candidates nearer it), anchor 2's last (opposite it: beyond the top 10); chunks of one anchor
    give the same numbers as one chunk."""
    from bigtrain.losses.contrastive import retrieval_metrics

    anchors = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    positives = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, -1.0]])
    nearer_1 = torch.tensor([[0.0, 1.0, 0.1], [0.1, 1.0, 0.0]])  # closer to anchor 1 than its positive (cos 0.71)
    nearer_2 = torch.tensor([[0.0, 0.0, 1.0]]).repeat(9, 1) + 0.01 * torch.arange(9.0)[:, None]  # 9 more for anchor 2
    candidates = torch.cat([positives, nearer_1, nearer_2])
    for chunk in (1024, 1):
        got = retrieval_metrics(anchors, candidates, chunk=chunk)
        assert got["accuracy"] == pytest.approx(1 / 3)
        assert got["mrr_at_10"] == pytest.approx((1 + 1 / 3 + 0) / 3)
        assert got["recall_at_10"] == pytest.approx(2 / 3)


def test_the_forward_with_a_graph_draws_the_dropout_masks_of_the_pass_before_it():
    """``engine.base.replaying`` restores the random state the step's pass recorded before its forward of a
    micro-batch: the forward with a graph then drops the same units (its embeddings equal the cached pass's, whose
    gradients it backpropagates); without it the masks differ."""
    from types import SimpleNamespace

    from bigtrain.engine.base import replaying
    from bigtrain.roles.in_batch_negatives import _random_state

    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(16, 64), nn.Dropout(0.5), nn.Linear(64, WIDTH)).train()
    rows = _rows(_examples(4))
    batch = SimpleNamespace(input_ids=rows)
    state = _random_state(batch)
    with torch.no_grad():
        first = encoder(rows)
    with replaying(SimpleNamespace(cached=SimpleNamespace(rng=state))):
        again = encoder(rows)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    assert not torch.equal(encoder(rows), first)  # the masks drawn afresh


def test_an_evaluation_s_fillers_are_neither_anchors_nor_candidates():
    """The loader fills an evaluation's last global batch with copies of a held-out example, labelled to count
    nothing: their candidates stay out of every real anchor's softmax, so the loss is the real examples' alone."""
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, WIDTH))
    examples = _examples(4)
    loss, grads = _by_hand(encoder, examples)
    padded = torch.cat([examples, examples[:1].repeat(2, 1, 1)])  # two fillers, copies of example 0
    encoder.zero_grad()
    with torch.no_grad():
        embedded = [encoder(_rows(padded[:3])), encoder(_rows(padded[3:]))]
    keep = [torch.tensor([True, True, True]), torch.tensor([True, False, False])]
    steps = cached_gradients(embedded, keep, COLUMNS, SCALE)
    for mb, step in zip((padded[:3], padded[3:]), steps, strict=True):
        ((encoder(_rows(mb)) * step.gradients).sum() / 4).backward()
    assert abs(float(sum(s.loss_sum for s in steps)) / 4 - loss) < 1e-6
    for g, p in zip(grads, encoder.parameters(), strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)
