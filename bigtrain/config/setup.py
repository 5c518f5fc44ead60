"""What a rule of the capability table (``capabilities.py``) looks at: one :class:`Setup`."""

from __future__ import annotations

from dataclasses import dataclass, field

from bigtrain.config.model_facts import ModelFacts
from bigtrain.config.plan import Plan
from bigtrain.config.schema import TrainConfig


@dataclass(frozen=True)
class Setup:
    """Everything a rule may look at."""

    plan: Plan
    train: TrainConfig = field(default_factory=TrainConfig)  # train-level options (compile, the global batch)
    model: ModelFacts | None = None  # None until the model's config has been read
