"""The causal-LM objective: the *sum* of next-token cross-entropies over the labelled positions, which the engine
scales by 1 / (labelled positions of the whole global batch); whole, compiled (``train.compile``) or chunked
(``parallel.loss_chunk_tokens``); plus a mixture's router loss where the model config asks for it.

Why a sum and a global count: the mean over micro-batches of per-micro-batch means weights a token by the size of
its micro-batch; dividing every token's loss by the same global count makes the gradient exactly that of one forward
over the whole global batch, for any split into ranks and micro-steps.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bigtrain.data.labels import IGNORE_INDEX, labelled_positions
from bigtrain.losses.base import NoStepMetrics, Terms


def labeled_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of cross-entropy against ``labels`` (already shifted; IGNORE_INDEX where nothing is predicted),
    in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=IGNORE_INDEX)


# train.compile: the same loss through inductor, which fuses the fp32 upcast into the log-softmax and keeps only the
# compute-dtype logits and one log-sum-exp per row for backward (eager keeps fp32 copies of the whole logits: on
# Llama-3.2-1B at 16k tokens, 14 GiB of a 62 GiB peak on an H100). Wrapped on first use: torch.compile imports
# inductor (1-2 s), which every process that does not compile should not pay.
def compiled_labeled_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return _compiled_loss()(logits, labels)


@functools.cache
def _compiled_loss() -> Any:
    return torch.compile(labeled_loss_sum)


def chunked_loss_sum(
    hidden: torch.Tensor, labels: torch.Tensor, head: nn.Module, chunk_tokens: int, autocast: torch.dtype | None
) -> torch.Tensor:
    """``labeled_loss_sum`` of ``head(hidden)`` computed ``chunk_tokens`` tokens at a time. Each chunk runs under
    activation checkpointing, which keeps only its hidden states: its logits (compute dtype and fp32) exist during
    its own forward and again during its own backward, never the whole micro-batch's. ``autocast``: the dtype the
    model's forward ran under (the head then computes in it as it would inside the forward)."""
    hidden, labels = hidden.flatten(0, 1), labels.flatten()
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for part, part_labels in zip(hidden.split(chunk_tokens), labels.split(chunk_tokens), strict=True):
        # every chunk, even one with nothing labelled: under DeepSpeed ZeRO-3 each call of the head is a collective
        total = total + checkpoint(_chunk_loss, head, autocast, part, part_labels, use_reentrant=False)
    return total


def _chunk_loss(
    head: nn.Module, autocast: torch.dtype | None, hidden: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    with torch.autocast(hidden.device.type, dtype=autocast, enabled=autocast is not None):
        if hasattr(head.weight, "ds_id"):  # DeepSpeed ZeRO-3: calling the module gathers its partitioned weight
            logits = head(hidden)
        else:  # the weight is whole here (FSDP2's root unit is gathered); no module hooks run once per chunk
            logits = F.linear(hidden, head.weight, head.bias)
    return F.cross_entropy(logits.float(), labels, reduction="sum", ignore_index=IGNORE_INDEX)


def router_loss_coef(hf_config: Any) -> float:
    """The weight of the router's load-balancing loss that a mixture-of-experts config asks for
    (``output_router_logits`` with ``router_aux_loss_coef``, as transformers adds it to its own loss); 0: none."""
    if not getattr(hf_config, "output_router_logits", False):
        return 0.0
    return float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0)


def router_loss(output: Any) -> torch.Tensor | None:
    """The load-balancing loss the model's forward computed for this micro-batch (``aux_loss``), if any.

    How it joins the objective (``Engine.forward_backward``): each forward's router loss is a mean over that
    forward's tokens, as transformers computes it; the step's objective adds ``coef`` times the mean of it over every
    forward of the global batch (all micro-batches on all data-parallel ranks), beside the token-summed
    cross-entropy over the global batch's labelled tokens. A single-process loop over the same micro-batches gets the
    same objective (tests/distributed/test_moe.py)."""
    aux = getattr(output, "aux_loss", None)
    return aux if isinstance(aux, torch.Tensor) else None


class CausalLM(NoStepMetrics):
    """Next-token cross-entropy summed over the labelled positions, and the router's load-balancing loss.

    ``head``: under a chunked loss, the LM head the loss applies ``chunk_tokens`` at a time (the model's forward
    then returns its final hidden states as "logits"); ``autocast``: the dtype that forward ran under; ``compiled``:
    the loss through inductor; ``router_weight``: the config's router loss coefficient (0: none)."""

    def __init__(
        self,
        head: nn.Module | None = None,
        chunk_tokens: int = 0,
        autocast: torch.dtype | None = None,
        compiled: bool = False,
        router_weight: float = 0.0,
    ) -> None:
        self.head, self.chunk_tokens, self.autocast, self.compiled = head, chunk_tokens, autocast, compiled
        self.per_forward_weight = router_weight

    def count(self, labels: torch.Tensor) -> int:
        return labelled_positions(labels)

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.head is None:
            return (compiled_labeled_loss_sum if self.compiled else labeled_loss_sum)(logits, labels)
        return chunked_loss_sum(logits, labels, self.head, self.chunk_tokens, self.autocast)

    def __call__(self, output: Any, batch: Any) -> Terms:
        loss = self.loss_sum(output.logits, batch.labels)
        return Terms(loss, router_loss(output) if self.per_forward_weight else None)

    def eval_sums(self, output: Any, batch: Any, terms: Terms) -> torch.Tensor:
        return torch.zeros(0, device=batch.labels.device)  # the loss is the whole evaluation

    def eval_metrics(self, loss: float, sums: torch.Tensor, count: int) -> dict[str, float]:
        return {"eval_perplexity": math.exp(min(loss, 700.0)), "eval_tokens": count}
