"""The chunked loss (``parallel.loss_chunk_tokens``) against the loss over all logits at once: the same token sum
and the same gradients (1e-6), with chunks that do not divide the tokens, unlabelled positions, a tied LM head, and
under bf16 autocast; the logits of the whole micro-batch never exist."""

from __future__ import annotations

import pytest
import torch
from cases import TINY_LLAMA

from bigtrain.config.hf import hf_config_from_dict
from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.losses.causal_lm import chunked_loss_sum, labeled_loss_sum
from bigtrain.parallel.transforms.chunked_loss import HeadInLoss


def _model(seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(hf_config_from_dict(TINY_LLAMA), attn_implementation="sdpa")


def _batch():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (3, 16), generator=generator)
    labels = torch.roll(ids, -1, dims=1)
    labels[:, -1] = IGNORE_INDEX
    labels[0, :5] = IGNORE_INDEX  # a prompt: nothing predicted
    return ids, labels


def _loss_and_grads(model, ids, labels, chunk, autocast=None):
    model.zero_grad()
    with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
        out = model(input_ids=ids).logits
    if chunk:
        loss = chunked_loss_sum(out, labels, model.lm_head.chunked_head, chunk, autocast)
    else:
        loss = labeled_loss_sum(out, labels)
    loss.backward()
    return loss.detach(), {n.replace(".chunked_head", ""): p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("chunk", [1, 7, 48, 1000])
def test_chunked_equals_whole(chunk):
    ids, labels = _batch()
    model = _model()
    whole, grads = _loss_and_grads(model, ids, labels, 0)
    model.lm_head = HeadInLoss(model.lm_head)
    chunked, chunked_grads = _loss_and_grads(model, ids, labels, chunk)
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=0)
    assert chunked_grads.keys() == grads.keys()
    assert model.lm_head.chunked_head.weight is model.model.embed_tokens.weight  # still tied
    for name, grad in grads.items():
        # the LM head's weight gradient is a sum over chunks instead of one matmul: float order, ~1e-7 of the norm
        gap = float((chunked_grads[name] - grad).norm() / grad.norm())
        assert gap < 1e-6, (name, gap)


def test_chunked_under_bf16_autocast_computes_the_head_in_bf16():
    ids, labels = _batch()
    model = _model()
    whole, _ = _loss_and_grads(model, ids, labels, 0, torch.bfloat16)
    model.lm_head = HeadInLoss(model.lm_head)
    chunked, _ = _loss_and_grads(model, ids, labels, 16, torch.bfloat16)
    fp32, _ = _loss_and_grads(model, ids, labels, 16)
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=0)
    assert abs(float(fp32 - whole)) > 1e-4  # bf16 really ran in both


def test_the_logits_of_the_whole_batch_never_exist():
    """The largest tensor the chunked loss saves or makes is one chunk's logits (fp32), not the batch's."""
    ids, labels = _batch()
    model = _model()
    model.lm_head = HeadInLoss(model.lm_head)
    hidden = model(input_ids=ids).logits
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = chunked_loss_sum(hidden, labels, model.lm_head.chunked_head, 8, None)
    loss.backward()
    assert max(sizes) <= 8 * TINY_LLAMA["hidden_size"]  # the chunks' hidden states, nothing of vocabulary size
