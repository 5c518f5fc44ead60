"""Enumerate every plan that meets the global batch, predict memory and time for each, keep what fits, rank.

Search space: backend (ddp, fsdp2 ZeRO-2/3, deepspeed ZeRO-1/2/3) x dp_replicate/dp_shard (HSDP) x tp (dividing the
world, up to two nodes' GPUs) x pp (dividing the rest; 1F1B or GPipe) x cp (long rows) x activation checkpointing
(none, selective, full) x micro-batch (powers of two) x offload (none, optimizer, parameters); then each capability
record (``config/capabilities``) adds the variants it weighs: gradient reduction, tp's loss and sequence parallelism,
checkpointing every other block, the chunked loss, expert parallelism, activation offload.

Nothing here says what runs together: every candidate is judged by the capability table with the workload's train
options, the model's facts and the data's, as ``bigtrain train`` judges a recipe. A plan that contradicts itself is
dropped; one that does not fit the model, the batch or the data is rejected with the table's message; one the trainer
cannot run yet is still predicted but ranked apart, so that the best plan offered is always one ``bigtrain train``
accepts, and ``bigtrain plan --all`` can show what the rest would cost. Pins (``fixed``) that no enumerated plan meets
are resolved as a recipe would be, so a contradiction among them gets the table's words too.
Ranked by predicted step time; among plans within NEAR_TIE of the fastest the simplest wins (fewer dimensions and
engines to go wrong). ``train.method: auto`` adds the method (full, lora, qlora) as a dimension: ``rank_methods``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from bigtrain.config.capabilities import (
    ALL_KINDS,
    CAPABILITIES,
    OPTIONS,
    RULES,
    SearchSpace,
    Setup,
    askable,
    check,
    first_problem,
    option_defaults,
    problems,
    with_job,
)
from bigtrain.config.plan import DEFAULT_GRAD_REDUCE, ZERO_STAGES, Plan
from bigtrain.config.resolve import parallel_of, resolve_plan
from bigtrain.config.schema import BACKENDS, CHECKPOINTING, GRAD_REDUCE
from bigtrain.config.setup import DataFacts, JobFacts
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.planner.cost import TimeEstimate
from bigtrain.planner.hardware import Cluster, size, sizes_apart
from bigtrain.planner.memory_terms import MemoryEstimate
from bigtrain.planner.planned import LM_MICRO_BATCHES, PlannedModel, planned
from bigtrain.planner.ranking import rank

AUTO_METHODS = ("full", "lora", "qlora")  # train.method auto: the order of preference
COMPETITIVE = 2.0  # full fine-tuning is preferred while its step takes at most this many times an adapter plan's
# rows at least this long get context-parallel plans weighed (shorter ones fit without; the search stays small)
CP_MIN_SEQ_LEN = 16384
# the schedules the memory and time terms model (one stage per rank); the multi-stage ones run from a recipe
PLANNED_SCHEDULES = ("1f1b", "gpipe")
# what --fix and a recipe's parallel section may pin: the plan's fields and the records' options (capabilities/)
PLAN_FIELDS = tuple(f.name for f in fields(Plan) if f.name != "options") + tuple(OPTIONS)
DEFAULT_OPTIONS = option_defaults()


def pinned_value(plan: Plan, key: str) -> Any:
    """The value of a pinnable key (``PLAN_FIELDS``) in ``plan``."""
    return OPTIONS[key].of(plan) if key in OPTIONS else getattr(plan, key)


VARIANTS = tuple(c.variants for c in CAPABILITIES if c.variants is not None)  # what each record weighs, in order


@dataclass(frozen=True)
class Candidate:
    """One plan as the search judged it. Its memory, whether it fits and its time are predicted on first use:
    ranking needs memory for every plan it ranks, time only for those that fit, and a search that does not show the
    plans the trainer cannot run yet never predicts them."""

    plan: Plan
    structural: str | None  # why it cannot work here whatever the memory (the table's fit rows, a node boundary)
    unsupported: str | None  # why it is not offered: the trainer cannot run it yet, or its terms are unchecked
    judged_by: _Judge = field(repr=False, compare=False)
    method: str = "full"  # the train.method it was predicted for
    compile: bool = False  # the train.compile it was predicted for
    fp8: str = "none"  # the train.fp8 it was predicted for

    @cached_property
    def memory(self) -> MemoryEstimate:
        return self.judged_by.model.estimate_memory(self.plan, self.judged_by.workload)

    @cached_property
    def rejected_because(self) -> str | None:
        """Why it does not fit: the structural reason, else the GPU's budget, else the node's host memory."""
        return self.structural or self.judged_by.over_budget(self.plan, self.memory)

    @property
    def fits(self) -> bool:
        return self.rejected_because is None

    @property
    def offloads(self) -> bool:
        return self.plan.offload_params or self.plan.offload_optimizer

    @cached_property
    def time(self) -> TimeEstimate:
        """Predicted on first use: ranking needs it only for plans that fit (a few percent of a large search);
        the rest are ranked by memory, and their time is computed when a table shows them."""
        return self.judged_by.predict_time(self.plan)

    @property
    def runnable(self) -> bool:
        return self.unsupported is None

    def to_dict(self) -> dict[str, Any]:
        if self.unsupported is not None:  # never offered as a choice: it does not "fit" what the user can run
            fits, reason = False, f"not runnable yet: {self.unsupported}"
        else:
            fits, reason = self.fits, self.rejected_because
        return {
            "plan": self.plan.to_dict(),
            "method": self.method,
            "compile": self.compile,
            "fp8": self.fp8,
            "memory": self.memory.to_dict(),
            "time": self.time.to_dict(),
            "fits": fits,
            "rejected_because": reason,
        }


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def judge(
    model: PlannedModel, plan: Plan, cluster: Cluster, train: Any, data: DataFacts | None, job: JobFacts
) -> tuple[str | None, str | None, bool]:
    """(why the plan cannot work here, why it is not offered, whether it contradicts itself): the capability table's
    rows (with the job's own) for this model, workload and data, and the planner's own rule that tensor parallelism
    stays inside a node."""
    rejected = None
    if plan.tp > cluster.gpus_per_node:
        rejected = f"tp={plan.tp} crosses node boundary ({cluster.gpus_per_node} GPUs per node)"
    not_offered = None
    setup = Setup(plan, train, model.facts, data, job)
    for rule in askable(with_job(RULES, job), ALL_KINDS, True, data is not None, True):  # problems(), inlined
        message = rule.says(setup)
        if message is None:
            continue
        if rule.kind == "invalid":
            return message, not_offered, True
        if rule.kind == "not_built":
            not_offered = not_offered or message
        else:
            rejected = rejected or message
    return rejected, not_offered, False


def _cp_degrees(cluster: Cluster, seq_len: int, fixed: dict[str, Any]) -> list[int]:
    """Context-parallel degrees worth weighing: 1, and for long rows (CP_MIN_SEQ_LEN or pinned) the degrees within
    a node (the all-to-alls around every attention want the fastest links)."""
    if "cp" in fixed:
        return [fixed["cp"]]
    if seq_len < CP_MIN_SEQ_LEN:
        return [1]
    return [d for d in _divisors(cluster.num_gpus) if d <= cluster.gpus_per_node]


def _layouts(
    cluster: Cluster, backend: str, seq_len: int, fixed: dict[str, Any], model_parallel: bool = True
) -> Iterator[tuple[int, ...]]:
    """(dp_replicate, dp_shard, tp, pp, cp) splits of the world for one backend: fsdp2 any split of dp into replicas
    of shards (HSDP), ddp replicas, deepspeed shards; without ``model_parallel`` (a model whose terms describe data
    parallelism only) tp = pp = cp = 1."""
    world = cluster.num_gpus
    for cp in _cp_degrees(cluster, seq_len, fixed) if model_parallel else [1]:
        for tp in [d for d in _divisors(world // cp) if d <= 2 * cluster.gpus_per_node] if model_parallel else [1]:
            for pp in _divisors(world // (tp * cp)) if model_parallel else [1]:
                dp = world // (tp * pp * cp)
                if backend == "fsdp2":
                    yield from ((r, dp // r, tp, pp, cp) for r in _divisors(dp))
                elif backend == "ddp":
                    yield dp, 1, tp, pp, cp
                else:
                    yield 1, dp, tp, pp, cp


# (offload_optimizer, offload_params): which backend offloads what is the table's (data_parallel's rows)
OFFLOADS = ((False, False), (True, False), (False, True))


def enumerate_plans(space: SearchSpace, cluster: Cluster, model: PlannedModel) -> Iterator[Plan]:
    """Every plan that meets the global batch and the pins in ``space.fixed``: the layouts, micro-batches,
    checkpointing, stages and offloads of each backend, then each capability record's variants; of those, the ones
    the model's terms describe (``PlannedModel.describes``). What the table's invalid rows refuse is skipped here (a
    frame) or dropped by ``judge`` (a variant)."""
    fixed = dict(space.fixed)
    batch = space.global_batch_size
    described = model.describes or (lambda plan: True)
    for backend in BACKENDS:
        for replicate, shard, tp, pp, cp in _layouts(cluster, backend, space.seq_len, fixed, model.model_parallel):
            dp = replicate * shard
            micro = [mb for mb in model.micro_batches(batch // dp) if batch % (mb * dp) == 0]
            schedules = PLANNED_SCHEDULES if pp > 1 else PLANNED_SCHEDULES[:1]
            # A frame (stage, schedule, offloads of this layout) is judged once by the rows that do not read the
            # micro-batch or the checkpointing (``Rule.reads_micro_batch``): one that contradicts itself in every
            # gradient-reduction mode is skipped with all its plans; one that cannot fit (tp across nodes, more
            # stages than layers) is shown by one plan instead of its every micro-batch and checkpointing.
            frames: dict[tuple[Any, ...], str] = {}
            for mb, ac, stage, schedule, (off_opt, off_par) in itertools.product(
                micro, CHECKPOINTING, ZERO_STAGES[backend], schedules, OFFLOADS
            ):
                frame = (stage, schedule, off_opt, off_par)
                if frames.get(frame, "weigh") != "weigh":
                    continue
                plan = Plan(
                    backend=backend,
                    zero_stage=stage,
                    grad_reduce=DEFAULT_GRAD_REDUCE[backend],
                    dp_replicate=replicate,
                    dp_shard=shard,
                    tp=tp,
                    pp=pp,
                    pp_schedule=schedule,
                    activation_checkpointing=ac,
                    micro_batch_size=mb,
                    offload_optimizer=off_opt,
                    offload_params=off_par,
                    cp=cp,
                    options=DEFAULT_OPTIONS,
                )
                if frame not in frames:
                    frames[frame] = "weigh"
                    verdicts = {m: space.frame_problem(plan.but(grad_reduce=m)) for m in GRAD_REDUCE}
                    possible = [m for m, v in verdicts.items() if v is None or v[0] != "invalid"]
                    if not possible:
                        frames[frame] = "skip"
                        continue
                    if not fixed and all(verdicts[m] is not None for m in possible):
                        frames[frame] = "shown"
                        shown = plan.but(grad_reduce=possible[0])
                        yield from [shown] if described(shown) else []
                        continue
                variants = [plan]
                for weigh in VARIANTS:
                    variants = weigh(variants, space)
                if fixed:
                    variants = [v for v in variants if all(pinned_value(v, k) == want for k, want in fixed.items())]
                yield from (v for v in variants if described(v))


def search(
    model: PlannedModel | Any,
    cluster: Cluster,
    workload: Workload,
    fixed: dict[str, Any] | None = None,
    predict_unrunnable: bool = False,
) -> list[Candidate]:
    """All candidates, best first: runnable plans that fit, by predicted step time (simplest on near ties); then
    runnable plans that do not fit; then the plans the trainer cannot run yet, ranked the same way among themselves
    (with ``predict_unrunnable``; else in the order they were generated, predicted only if something reads them).
    With ``workload.method`` auto, every method's candidates, the preferred method's best first (``rank_methods``).
    ``model``: the job's ``PlannedModel`` (a causal LM's ``ModelStats`` is taken as its)."""
    stats = planned(model)
    rank_apart = rank if predict_unrunnable else list
    if workload.method == "auto":
        per_method, refused = [], []
        for method in AUTO_METHODS:  # a method the table refuses outright (qlora without bf16) is not a choice
            try:
                per_method.append(search(stats, cluster, replace(workload, method=method), fixed, False))
            except ConfigError as e:
                refused.append(e)
        if not per_method:
            raise refused[0]
        return rank_methods(per_method, rank_apart)
    if workload.compile == "auto" or workload.fp8 == "auto":
        every = [c for w in speed_workloads(workload, cluster) for c in _search_method(stats, cluster, w, fixed or {})]
        return rank([c for c in every if c.runnable]) + rank_apart([c for c in every if not c.runnable])
    every = _search_method(stats, cluster, workload, fixed or {})
    return rank([c for c in every if c.runnable]) + rank_apart([c for c in every if not c.runnable])


def speed_workloads(workload: Workload, cluster: Cluster) -> list[Workload]:
    """``train.compile`` / ``train.fp8`` auto: the concrete workloads weighed. Compile on and off; FP8 none, and
    tensorwise and rowwise only where the GPU's profile measured FP8 matmuls (``bigtrain probe`` on a GPU with FP8
    tensor cores): on the datasheet's peak alone the model predicts gains the H100 runs did not show at small
    widths (bench/results/side_by_side_h100.md)."""
    compiles = [False, True] if workload.compile == "auto" else [workload.compile]
    fp8s = [workload.fp8]
    if workload.fp8 == "auto":
        measured = {dtype for dtype, _, _ in cluster.gpu.measured_tflops}
        fp8s = ["none"] + [r for r in ("tensorwise", "rowwise") if f"fp8-{r}" in measured and cluster.gpu.fp8_tflops]
    return [replace(workload, compile=c, fp8=f) for c in compiles for f in fp8s]


def rank_methods(
    per_method: list[list[Candidate]], rank_apart: Callable[[list[Candidate]], list[Candidate]] | None = None
) -> list[Candidate]:
    """``train.method: auto``: plans without offload first (offload is the slow way to fit); among them the first
    method of AUTO_METHODS whose best plan fits, full fine-tuning only while its step is at most COMPETITIVE times
    an adapter plan's (it trains every weight, for about 1.5x the FLOPs), LoRA before QLoRA (an exact base). When
    only offloading plans fit, the fastest of them (QLoRA's 4-bit base also moves a quarter of LoRA's bytes over
    PCIe and keeps a quarter in host memory). The rest follow, ranked as ``ranking.rank`` does across methods."""
    every = [c for ranked in per_method for c in ranked]

    def best(method: str, offload: bool) -> Candidate | None:
        return next((c for c in every if c.method == method and c.fits and c.runnable and c.offloads == offload), None)

    chosen = None
    in_memory = [c for c in (best(m, False) for m in AUTO_METHODS) if c is not None]
    offloading = [c for c in (best(m, True) for m in AUTO_METHODS) if c is not None]
    if in_memory:
        fastest = min(c.time.step_s for c in in_memory)
        chosen = next(c for c in in_memory if c.time.step_s <= COMPETITIVE * fastest)
    elif offloading:
        chosen = min(offloading, key=lambda c: c.time.step_s)
    rest = rank([c for c in every if c.runnable and c is not chosen])
    return ([chosen] if chosen else []) + rest + (rank_apart or rank)([c for c in every if not c.runnable])


def candidate(model: PlannedModel | Any, plan: Plan, cluster: Cluster, workload: Workload) -> Candidate:
    """One plan judged and predicted for ``workload`` on ``cluster``: its memory, whether it fits the GPU's and the
    node's host memory (and why not), whether the trainer runs it; its time on first use."""
    judged = _Judge(planned(model), cluster, workload)(plan, keep_invalid=True)
    assert judged is not None
    return judged


class _Judge:
    """Judges the plans of one search: what every candidate shares is made once (a search judges thousands)."""

    def __init__(self, model: PlannedModel, cluster: Cluster, workload: Workload) -> None:
        self.model, self.cluster, self.workload = model, cluster, workload
        self.train = workload.train_config()
        self.data = workload.data_facts()
        self.job = workload.job
        self.table = with_job(RULES, self.job)

    def rides_along(self, base: Plan, variant: Plan) -> bool:
        """``SearchSpace.rides_along``: the trainer runs ``base`` (no not_built row trips) and ``variant`` trips no row
        that ``base`` does not."""
        seen = {p.rule.name: p.rule.kind for p in problems(self._setup(base))}
        if "not_built" in seen.values():
            return False
        return all(p.rule.name in seen for p in problems(self._setup(variant)))

    def _setup(self, plan: Plan) -> Setup:
        return Setup(plan, self.train, self.model.facts, self.data, self.job)

    def contradicts(self, plan: Plan) -> bool:
        """Whether a row of kind ``invalid`` trips for ``plan`` (``SearchSpace.contradicts``)."""
        return first_problem(self._setup(plan), ("invalid",)) is not None

    def frame_problem(self, plan: Plan) -> tuple[str, str] | None:
        """(kind, message) of the first row of kind invalid or fit that trips for ``plan`` among the rows that do
        not read the micro-batch or the checkpointing, with the planner's node rule (``SearchSpace.frame_problem``)."""
        setup = self._setup(plan)
        for rule in askable(self.table, ("invalid", "fit"), True, self.data is not None, True):
            message = None if rule.reads_micro_batch else rule.says(setup)
            if message is not None:
                return rule.kind, message
        if plan.tp > self.cluster.gpus_per_node:
            return "fit", "crosses a node"
        return None

    def space(self, fixed: dict[str, Any]) -> SearchSpace:
        return SearchSpace(
            self.model.facts,
            self.cluster.gpus_per_node,
            self.workload.seq_len,
            self.workload.global_batch_size,
            fixed,
            self.rides_along,
            self.contradicts,
            self.frame_problem,
            link_groups=self.cluster.replica_link.groups if self.cluster.replica_link else 0,
            on_gpus=self.cluster.gpu.name != "CPU",
            job=self.job,
            method=self.workload.method,
            modules_to_save=bool(self.workload.modules_to_save),
        )

    def predict_time(self, plan: Plan) -> TimeEstimate:
        return self.model.estimate_time(plan, self.cluster, self.workload)

    def __call__(self, plan: Plan, keep_invalid: bool = False) -> Candidate | None:
        """The candidate, or None for a plan that contradicts itself (unless ``keep_invalid``: a written plan)."""
        w = self.workload
        reason, not_offered, invalid = judge(self.model, plan, self.cluster, self.train, self.data, self.job)
        if invalid and not keep_invalid:
            return None
        return Candidate(plan, reason, not_offered, self, w.method, w.compile, w.fp8)

    def over_budget(self, plan: Plan, mem: MemoryEstimate) -> str | None:
        """Why ``plan`` (predicted to need ``mem``) does not fit the GPU's memory or the node's host memory."""
        cluster, budget = self.cluster, self.cluster.gpu.memory_bytes
        if mem.budget_bytes > budget:
            need, have = sizes_apart(mem.budget_bytes, budget)
            return f"needs {need} > {have} budget (peak + margin per GPU)"
        host = self.model.host_bytes(plan, self.workload) * min(cluster.gpus_per_node, cluster.num_gpus)
        if host and not cluster.host_bytes_per_node:  # CPU processes: host memory is their own, nothing to free
            return "offloads to host memory, which on CPU processes is the memory it would free"
        if host > cluster.host_bytes_per_node:
            return (
                f"needs {size(host)} of host memory per node for its offload > {size(cluster.host_bytes_per_node)} "
                "(--host-memory)"
            )
        return None


def _search_method(
    model: PlannedModel, cluster: Cluster, workload: Workload, fixed: dict[str, Any]
) -> list[Candidate]:
    judge_plan = _Judge(model, cluster, workload)
    train = judge_plan.train
    judged = (judge_plan(p) for p in enumerate_plans(judge_plan.space(fixed), cluster, model))
    out = [c for c in judged if c is not None]
    if not out:
        pins = ", ".join(f"{k}={v}" for k, v in fixed.items()) or "none"
        # the words a recipe would get: pins that contradict each other, the batch or the model, or a job whose own
        # settings every plan contradicts (LoRA on a CNN)
        try:
            plan = resolve_plan(parallel_of(fixed), cluster.num_gpus, train)
        except ConfigError:
            if fixed:
                raise
        else:
            check(judge_plan._setup(plan), ALL_KINDS if fixed else ("invalid",), judge_plan.table)
        if fixed:
            raise ConfigError(
                f"the pins ({pins}) make a plan bigtrain train runs, but not one the planner searches: it weighs "
                f"pp_schedule {' or '.join(PLANNED_SCHEDULES)} with one stage per rank, micro-batches "
                f"{', '.join(map(str, LM_MICRO_BATCHES))} and tp up to twice the GPUs per node; set such a plan in a "
                "recipe's parallel section"
            )
        raise ConfigError(
            f"no plan meets global batch {workload.global_batch_size} on {cluster.num_gpus} GPUs with pins ({pins}); "
            "use a global batch that is a multiple of the GPU count, or fewer pins"
        )
    return out
