"""``train.objective: contrastive``: an embedding model's cross-entropy of each anchor's positive among every
candidate of the global batch (all positives and hard negatives, gathered over the data-parallel ranks), on cosine
similarities over ``train.contrastive_temperature`` (sentence-transformers' ``MultipleNegativesRankingLoss`` with
``gather_across_devices``), exact whatever the micro-batches and ranks through a gradient cache
(``losses/contrastive.py``, ``roles/in_batch_negatives.py``); evaluated as the held-out anchors whose positive ranks
first. The objective of ``model.task: embedding``."""

from __future__ import annotations

from typing import Any

from bigtrain.config.setup import EMBEDDINGS
from bigtrain.errors import ConfigError
from bigtrain.objectives.spec import ObjectiveSpec


def make(built: Any, train: Any) -> Any:
    from bigtrain.losses.contrastive import InBatchNegatives

    return InBatchNegatives(1.0 / train.contrastive_temperature, train.pooling)


def attach(engine: Any, options: Any, train: Any) -> None:
    """The step's pass that embeds every micro-batch first and caches the global loss's gradients."""
    from bigtrain.roles.in_batch_negatives import InBatchNegatives

    engine.reference = InBatchNegatives(engine, 1.0 / train.contrastive_temperature, engine.objective.embed)


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


OBJECTIVE = ObjectiveSpec(
    name="contrastive",
    summary="in-batch negatives over the global batch (cosine over a temperature), exact over micro-batches and ranks",
    reads=EMBEDDINGS,
    make=make,
    rows_per_example=2,
    attach=attach,
    check=check,
    keys=("train.contrastive_temperature", "train.pooling"),
    batch_noun="pairs",
    shown=("accuracy",),
    refusal=lambda task: (
        f"train.objective=contrastive trains text embeddings, which a {task} model does not give; use "
        "model.task=embedding"
    ),
)
