"""``train.objective: contrastive``: an embedding model's cross-entropy of each anchor's positive among every
candidate of the global batch (all positives and hard negatives, gathered over the data-parallel ranks), on cosine
similarities over ``train.contrastive_temperature`` (sentence-transformers' ``MultipleNegativesRankingLoss`` with
``gather_across_devices``), exact whatever the micro-batches and ranks through a gradient cache
(``losses/contrastive.py``, ``roles/in_batch_negatives.py``); evaluated as the held-out anchors whose positive ranks
first. The objective of ``model.task: embedding``."""

from __future__ import annotations

from typing import Any

from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.capabilities.table import row
from bigtrain.config.setup import EMBEDDINGS, Setup
from bigtrain.errors import ConfigError
from bigtrain.objectives.spec import ObjectiveSpec


def make(built: Any, train: Any) -> Any:
    from bigtrain.losses.contrastive import InBatchNegatives, family_pooling

    # a run's recipe has its pooling made the family's at start-up (tasks/embedding.prepare); a simulated step's not
    pooling = train.pooling if train.pooling != "auto" else family_pooling(built.parts[0].config)
    return InBatchNegatives(1.0 / train.contrastive_temperature, pooling)


def attach(engine: Any, options: Any, train: Any) -> None:
    """The step's pass that embeds every micro-batch first and caches the global loss's gradients."""
    from bigtrain.roles.in_batch_negatives import InBatchNegatives

    engine.reference = InBatchNegatives(engine, 1.0 / train.contrastive_temperature, engine.objective)


def synthetic(hf_config: Any, plan: Any, workload: Any, device: Any) -> Any:
    """A micro-batch as the data path makes it: m examples as their anchors' and positives' rows of the workload's
    length, unpadded."""
    import torch

    from bigtrain.data.text_pairs import EmbeddingBatch

    examples, length = plan.micro_batch_size, workload.seq_len
    ids = torch.randint(0, hf_config.vocab_size, (2 * examples, length), device=device)  # anchors, positives
    return EmbeddingBatch(ids, torch.ones_like(ids), torch.zeros(examples, dtype=torch.long, device=device))


def count_anchors(batch: Any, workload: Any, plan: Any) -> float:
    """A global batch counts its anchors."""
    return float(workload.global_batch_size)


def check(cfg: Any) -> None:
    temperature = cfg.train.contrastive_temperature
    if temperature <= 0:
        raise ConfigError(
            f"train.contrastive_temperature={temperature} must be above 0 (0.05: sentence-transformers' default)"
        )
    if cfg.train.global_batch_size < 2:
        raise ConfigError(
            f"train.global_batch_size={cfg.train.global_batch_size}: in-batch negatives need at least 2 anchors a "
            "step (the other anchors' positives are each one's negatives); use 32 or more"
        )


def selective_checkpointing_on_zero3(s: Setup) -> str | None:
    """After the step's pass without a graph, a block's recompute in backward under ZeRO-3 all-gathers parameters its
    forward did not, which torch's selective checkpointing refuses ("c10d._allgather_base_ encountered during backward
    but not found in storage", seen on 2 CPU ranks; full checkpointing and ZeRO-2 train equal to the plain loop)."""
    p = s.plan
    if p.backend == "deepspeed" and p.zero_stage == 3 and p.activation_checkpointing == "selective":
        return (
            "parallel.activation_checkpointing=selective with backend deepspeed zero_stage=3 and "
            "train.objective=contrastive is not built yet (a block's recompute gathers parameters its forward did "
            "not); "
            "use activation_checkpointing=full, zero_stage 2 or backend fsdp2"
        )
    return None


def negatives_of_one_replica_group(s: Setup) -> str | None:
    """Replica groups synchronising every H steps each gather over their own ranks: every group's anchors would meet
    only its slice of the global batch's candidates, and its evaluation only its share of the held-out set."""
    mode = settings_of(s.plan).mode
    if mode != "every_step":
        return (
            f"parallel.sync={mode} with train.objective=contrastive is not built yet (each replica group would score "
            "its anchors against its own slice of the global batch only); use parallel.sync=every_step"
        )
    return None


OBJECTIVE = ObjectiveSpec(
    name="contrastive",
    summary="in-batch negatives over the global batch (cosine over a temperature), exact over micro-batches and ranks",
    reads=EMBEDDINGS,
    make=make,
    # the global batch counts examples and throughput pairs (an example's texts, 2 or more, are the data's: the
    # planner weighs an anchor and its positive, planner/embedding_plan.py)
    rows_per_example=1,
    attach=attach,
    synthetic=synthetic,
    count=count_anchors,
    check=check,
    keys=("train.contrastive_temperature", "train.pooling"),
    rules=(
        row(selective_checkpointing_on_zero3, "not_built", reads_micro_batch=True),
        row(negatives_of_one_replica_group, "not_built"),
    ),
    batch_noun="pairs",
    shown=("accuracy",),
    refusal=lambda task: (
        f"train.objective=contrastive trains text embeddings, which a {task} model does not give; use "
        "model.task=embedding"
    ),
)
