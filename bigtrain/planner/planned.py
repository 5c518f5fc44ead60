"""What the planner weighs of one job's model: its statistics and the memory and time terms that read them, for any
task (a task's spec makes it: ``TaskSpec.planner``). The search, ``plan: auto``, the prediction at start-up and the
plan table take this one value, so a task with statistics of its own (a classifier's, measured on fake tensors)
plans through the same search, near-tie rule and result as a causal LM.

Besides its terms, a model says which plans its terms describe (``describes``): a classifier's model data
parallelism only, with full activation checkpointing or none, no offload: the search does not offer plans it cannot
predict (as it offers only the pipeline schedules its terms model). And it says how many rows a rank's micro-batch
may hold (``micro_batches``: a causal LM's rows of thousands of tokens, 1 to 32; a classifier's examples, up to a
rank's whole share of the batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bigtrain.config.model_facts import ModelFacts
from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.hardware import Cluster

LM_MICRO_BATCHES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class PlannedModel:
    """One job's model as the planner sees it.

    - ``stats``: the task's statistics of the model (``ModelStats``, ``ClassifierStats``);
    - ``memory(stats, plan, workload) -> MemoryEstimate``, ``time(stats, plan, cluster, workload) ->
      TimeEstimate``, ``host(stats, plan, workload) -> bytes``: its terms;
    - ``micro_batches(rows_per_rank) -> sizes``: the micro-batches the search weighs for a rank's share of a step;
    - ``model_parallel``: its terms model tp, pp and cp (else the search lays out data parallelism only);
    - ``describes(plan)``: whether its terms describe a plan (None: every plan the search makes);
    - ``headline(stats, workload)``: the table's words for the model; ``summary(stats)``: the JSON's;
    - ``scaling_view``: the plan table shows the scaling from one GPU (``scaling.py``) without being asked;
    - ``choice_note(candidate, cluster) -> lines``: what the model says under the table of the chosen plan.
    """

    stats: Any
    memory: Callable[[Any, Plan, Workload], Any]
    time: Callable[[Any, Plan, Cluster, Workload], Any]
    host: Callable[[Any, Plan, Workload], int]
    micro_batches: Callable[[int], tuple[int, ...]] = field(default=lambda rows: LM_MICRO_BATCHES)
    model_parallel: bool = True
    describes: Callable[[Plan], bool] | None = None
    headline: Callable[[Any, Workload], str] | None = None
    summary: Callable[[Any], dict[str, Any]] | None = None
    scaling_view: bool = False  # its plan table shows the scaling from one GPU (a data-parallel model's measure)
    lm_notes: bool = True  # the table's notes on what adapters train of a decoder's blocks (a causal LM's terms)
    # said under the table where a GPU's measurement contradicted the time model for this kind of job, until the
    # model is corrected (its step times are then marked unchecked); None: nothing contradicted it
    time_note: str | None = None
    choice_note: Callable[[Any, Cluster], list[str]] | None = None

    @property
    def facts(self) -> ModelFacts:
        return self.stats.facts

    @property
    def params(self) -> int:
        return self.stats.params

    def estimate_memory(self, plan: Plan, workload: Workload) -> Any:
        return self.memory(self.stats, plan, workload)

    def estimate_time(self, plan: Plan, cluster: Cluster, workload: Workload) -> Any:
        return self.time(self.stats, plan, cluster, workload)

    def host_bytes(self, plan: Plan, workload: Workload) -> int:
        return self.host(self.stats, plan, workload)


def lm_model(model: Any) -> PlannedModel:
    """A causal LM (or a vision-language model's language model and tower) as the planner's formulas and block
    measurements describe it (``model_stats.py``): its config dict, or its ``ModelStats``."""
    from bigtrain.planner.memory import estimate_memory, host_bytes
    from bigtrain.planner.model_stats import ModelStats
    from bigtrain.planner.rollout_time import estimate_step_time

    stats = model if isinstance(model, ModelStats) else ModelStats.from_config(model)
    # the step's time with what online RL's rollouts add before it (rollout_time.py)
    return PlannedModel(stats, estimate_memory, estimate_step_time, host_bytes)


def planned(model: Any) -> PlannedModel:
    """``model`` as a ``PlannedModel``: itself, or a causal LM's statistics (what the planner's callers and tests
    hand the search)."""
    return model if isinstance(model, PlannedModel) else lm_model(model)
