"""The recipe keys of embedding models (``model.task: embedding``, ``train.objective: contrastive``), kept apart from
``schema.py``, which reads them into its ``train`` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bigtrain.config.schema_fields import doc

Pooling = Literal["auto", "mean", "cls", "last_token"]


@dataclass
class EmbeddingKeys:
    """``train.`` keys of the contrastive objective (sentence-transformers' names where it has them)."""

    contrastive_temperature: float = doc(
        "contrastive: the temperature the cosine similarities are divided by before the cross-entropy over in-batch "
        "negatives (sentence-transformers' scale 20 is 0.05).",
        default=0.05,
    )
    pooling: Pooling = doc(
        "contrastive: how a text's token states become its embedding: mean (over the tokens, not padding), cls (the "
        "first token), last_token (a decoder's). auto: last_token for decoder families, else mean "
        "(sentence-transformers' defaults).",
        default="auto",
    )
