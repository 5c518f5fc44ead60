"""What a row of the capability table (``capabilities/``) looks at: one :class:`Setup`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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


# what a task's model gives per example, which decides the objectives that apply (``TaskSpec.outputs``,
# ``ObjectiveSpec.reads``)
TOKEN_ROWS = "token rows"  # logits over the vocabulary at every position of a row (causal LMs, VLMs)
EXAMPLES = "examples"  # one output vector per example (classifiers, regressors)
SCORES = "scores"  # one number per row, compared across the rows of an example (a reward model's pairs)
EMBEDDINGS = "embeddings"  # each row's token states, pooled into one vector per text (an embedding model's)
DENOISED = "denoised latents"  # a diffusion transformer's prediction for noisy latents (velocity, noise)


@dataclass(frozen=True)
class JobFacts:
    """What the table's rows, the planner and the simulator read of a job's task and objective, as plain values.

    The specs (``bigtrain/tasks``, ``bigtrain/objectives``) make it (``Job.facts``); nothing below them knows a task
    or an objective by its name: a row reads what the job needs (its roles, its rows per example), and a task's or
    an objective's own rows come with it (``rules``), asked with the capability table's."""

    task: str = "causal-lm"  # model.task, resolved (for the words of a message)
    objective: str = "sft"  # train.objective, resolved (for the words of a message)
    unit: str = "tokens"  # what throughput counts: tokens, images, examples
    rows_per_example: int = 1  # rows of a micro-batch per example the global batch counts (a preference pair: 2)
    roles: tuple[str, ...] = ()  # models the objective needs besides the policy (``reference``): role records
    rules: tuple[Any, ...] = ()  # the task's and the objective's own rows (``capabilities.table.Rule``)


@dataclass(frozen=True)
class Setup:
    """Everything a rule may look at."""

    plan: Plan
    train: TrainConfig = field(default_factory=TrainConfig)  # train-level options (compile, the global batch)
    model: ModelFacts | None = None  # None until the model's config has been read
    data: DataFacts | None = None  # None until the data is known (recipe resolution runs before it is read)
    job: JobFacts | None = None  # None until the task and the objective are resolved (start-up, the planner)
