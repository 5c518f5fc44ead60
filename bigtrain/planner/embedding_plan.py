"""An embedding model's memory and time terms (``model.task: embedding``, ``train.objective: contrastive``).

The model is the family's base model (its token states, no head): the terms are the one-output sequence classifier's
(``classifier_plan.py``: statistics measured on fake tensors at the row length; a head of one output weighs nothing
beside the body), over the example's texts (an anchor and its positive: two). A step of several micro-batches per rank
adds what its gradient cache does (``roles/in_batch_negatives.py``); a step of one scores the gathered candidates in
its forward (their [anchors, candidates] scores are small beside its activations) and adds nothing:

- **time**: every micro-batch is embedded twice, once without a graph (to score the whole global batch) and once with
  it (to backpropagate the cached gradients): one more forward, 4/3 of a forward and backward;
- **memory**: each local row's cached gradient ([rows of the rank's step, width], fp32) lives from the step's first
  pass to its last backward; the first pass's scoring (every rank's embeddings gathered with their gradients, the
  [anchors, candidates] scores, their softmax and gradient, all fp32) comes before any activation is kept, so it
  counts only where it outweighs the activations.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.hardware import count
from bigtrain.planner.planned import PlannedModel

FP32 = 4
# the texts of an example the planner weighs: its anchor and its positive (hard negatives add theirs, which the data
# says and the planner is not told); the global batch and the micro-batch count examples, throughput pairs
ROWS = 2
EXTRA_FORWARD = 4 / 3  # (forward without a graph + forward + backward as two forwards) / (forward + backward)


def cached_bytes(width: int, plan: Plan, workload: Workload) -> tuple[int, int]:
    """(the rank's cached gradients, the scoring pass's tensors) in bytes."""
    columns, examples = ROWS, workload.global_batch_size
    own = columns * examples // plan.dp
    gathered = 2 * columns * examples * width * FP32  # the embeddings and their gradients, every rank's
    scores = 3 * examples * (columns - 1) * examples * FP32  # scores, softmax, their gradient
    return own * width * FP32, gathered + scores


def as_texts(plan: Plan, workload: Workload) -> tuple[Plan, Workload]:
    """The plan and workload as the one-output model's terms weigh them: rows of texts."""
    rows = dataclasses.replace(workload, global_batch_size=ROWS * workload.global_batch_size)
    return plan.but(micro_batch_size=ROWS * plan.micro_batch_size), rows


def cached(plan: Plan, workload: Workload) -> bool:
    """Whether the plan's step goes through the gradient cache: several micro-batches per rank."""
    return plan.grad_accum_steps(workload.global_batch_size) > 1


def embedding_model(model_config: dict[str, Any], workload: Workload) -> PlannedModel:
    """The classifier's terms of the family's one-output model with the gradient cache's (module docstring)."""
    from bigtrain.planner.classifier_plan import classifier_model

    base = classifier_model(model_config, workload)
    width = int(model_config["hidden_size"])
    memory, time = base.memory, base.time

    def with_cache(stats: Any, plan: Plan, workload: Workload) -> Any:
        estimate = memory(stats, *as_texts(plan, workload))
        if not cached(plan, workload):
            return estimate
        own, scoring = cached_bytes(width, plan, workload)
        other = estimate.other_bytes + own + max(0, scoring - estimate.activations_bytes)
        return dataclasses.replace(estimate, other_bytes=other)

    def twice_forward(stats: Any, plan: Plan, cluster: Any, workload: Workload) -> Any:
        extra = EXTRA_FORWARD if cached(plan, workload) else 1.0
        more = dataclasses.replace(stats, flops_per_example=extra * stats.flops_per_example)
        rows_plan, rows = as_texts(plan, workload)
        estimate = time(more, rows_plan, cluster, rows)
        # pairs per second (the terms count texts); MFU counts the model's FLOPs: the cache's extra forward is
        # overhead, as checkpointing's recompute is
        pairs = estimate.tokens_per_s_per_device / ROWS
        return dataclasses.replace(estimate, tokens_per_s_per_device=pairs, mfu=estimate.mfu / extra)

    def headline(stats: Any, workload: Workload) -> str:
        words = (
            f"model {stats.describe}: {count(stats.params)} params, {stats.flops_per_example / 1e9:,.0f} GFLOP per "
            f"text (forward + backward; with accumulation the gradient cache adds a forward: x{EXTRA_FORWARD:.2f})"
        )
        if workload.method == "lora":
            words += f"; LoRA r={workload.lora_rank}: {count(stats.lora_params(workload.lora_rank))} trained"
        return words

    return dataclasses.replace(base, memory=with_cache, time=twice_forward, headline=headline)
