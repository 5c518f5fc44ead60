"""What a row of the capability table (``capabilities/``) looks at: one :class:`Setup`."""

from __future__ import annotations

from dataclasses import dataclass, field

from bigtrain.config.model_facts import ModelFacts
from bigtrain.config.plan import Plan
from bigtrain.config.schema import TrainConfig


@dataclass(frozen=True)
class DataFacts:
    """What the rows need to know about the data and how it is read: start-up reads them from the recipe and the
    data, the planner from its workload (``Workload.data_facts``)."""

    seq_len: int  # tokens per row
    packed: bool = False  # data.packing: documents (records packed into a row, kept apart by position ids)
    attention: str = "sdpa"  # model.attn_implementation, resolved


@dataclass(frozen=True)
class Setup:
    """Everything a rule may look at."""

    plan: Plan
    train: TrainConfig = field(default_factory=TrainConfig)  # train-level options (compile, the global batch)
    model: ModelFacts | None = None  # None until the model's config has been read
    data: DataFacts | None = None  # None until the data is known (recipe resolution runs before it is read)
