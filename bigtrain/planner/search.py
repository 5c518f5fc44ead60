"""Enumerate every plan that meets the global batch, predict memory and time for each, keep what fits, rank.

Search space: backend (ddp, fsdp2 ZeRO-2/3, deepspeed ZeRO-1/2/3) x gradient reduction during accumulation (fsdp2:
every micro-step or once per step) x dp_replicate/dp_shard (HSDP) x tp (dividing the attention and KV heads, within
a node; with loss and sequence parallelism where the model allows them) x pp (dividing the layers; 1F1B or
GPipe) x cp (long rows) x ep (mixtures of experts) x activation checkpointing (none, selective, full, full every
other block) x micro-batch (powers of two) x offload (parameters or optimizer; activations for long
rows) x the chunked loss (rows longer than a chunk).

Every candidate is judged by the capability table (``config/capabilities.py``) with the workload's train options
(``train.compile``) and the model's facts, as ``bigtrain train`` judges a recipe: a plan that does not fit the model
or the batch is rejected with the table's message; a plan the trainer cannot run yet is still predicted but ranked
apart, so that the best plan offered is always one ``bigtrain train`` accepts, and ``bigtrain plan --all`` can show
what the rest would cost. Pins (``fixed``) that no enumerated plan meets are resolved as a recipe would be, so a
contradiction among them gets the table's words too.
Ranked by predicted step time; among plans within NEAR_TIE of the fastest the simplest wins
(fewer dimensions and engines to go wrong). ``train.method: auto`` adds the method (full, lora, qlora) as a
dimension: see ``rank_methods``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from bigtrain.config.capabilities import Setup, check, problems
from bigtrain.config.hf import PLAIN_TP_STYLES
from bigtrain.config.plan import CHOOSES_GRAD_REDUCE, DEFAULT_GRAD_REDUCE, ZERO_STAGES, Plan
from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import BACKENDS, CHECKPOINTING, GRAD_REDUCE, ParallelConfig, TrainConfig
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.planner.cost import TimeEstimate, estimate_time
from bigtrain.planner.hardware import Cluster, GiB
from bigtrain.planner.memory import estimate_memory, host_bytes
from bigtrain.planner.memory_terms import MemoryEstimate
from bigtrain.planner.model_stats import ModelStats

NEAR_TIE = 0.02
AUTO_METHODS = ("full", "lora", "qlora")  # train.method auto: the order of preference
COMPETITIVE = 2.0  # full fine-tuning is preferred while its step takes at most this many times an adapter plan's
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
# parallel.loss_chunk_tokens the search offers: a chunk's logits at a 128k vocabulary are 6 GiB in fp32 (12 bytes per
# logit for the loss backward), against 49 GiB for one 32k-token sequence's; the recomputed head costs the same
# FLOPs whatever the chunk size, and smaller chunks only add launches
LOSS_CHUNK_TOKENS = 4096
# rows at least this long get context-parallel plans weighed (shorter ones fit without; the search stays small)
CP_MIN_SEQ_LEN = 16384
# rows (per cp rank) at least this long get activation offload weighed: below it a block's compute does not hide
# the copy of what it saves (without checkpointing, ~34 bytes per token and hidden unit against ~24 FLOPs)
OFFLOAD_MIN_SEQ_LEN = 16384
# the schedules the memory and time terms model (one stage per rank); the multi-stage ones run from a recipe
PLANNED_SCHEDULES = ("1f1b", "gpipe")
PLAN_FIELDS = tuple(f.name for f in fields(Plan))


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    memory: MemoryEstimate
    fits: bool  # structurally valid and within the memory budget
    rejected_because: str | None  # why it does not fit
    unsupported: str | None  # why it is not offered: the trainer cannot run it yet, or its terms are unchecked
    predict_time: Callable[[Plan], TimeEstimate] = field(repr=False, compare=False)
    method: str = "full"  # the train.method it was predicted for
    compile: bool = False  # the train.compile it was predicted for
    fp8: str = "none"  # the train.fp8 it was predicted for

    @property
    def offloads(self) -> bool:
        return self.plan.offload_params or self.plan.offload_optimizer

    @cached_property
    def time(self) -> TimeEstimate:
        """Predicted on first use: ranking needs it only for plans that fit (a few percent of a large search);
        the rest are ranked by memory, and their time is computed when a table shows them."""
        return self.predict_time(self.plan)

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


def complexity(plan: Plan) -> int:
    """How many moving parts a plan has; breaks near ties in favour of the simpler plan."""
    score = {"ddp": 0, "fsdp2": 1, "deepspeed": 2}[plan.backend] + (plan.zero_stage == 3)
    score += 2 * (plan.tp > 1) + 2 * (plan.pp > 1) + 2 * (plan.cp > 1) + 2 * (plan.ep > 1)
    score += plan.dp_replicate > 1 and plan.backend == "fsdp2"
    score += {"none": 0, "selective": 1, "full": 2}[plan.activation_checkpointing] + (plan.loss_chunk_tokens > 0)
    return score + 3 * (plan.offload_params or plan.offload_optimizer) + 2 * plan.offload_activations


def _tp_companions(stats: ModelStats, tp: int, fixed: dict[str, Any]) -> tuple[bool, bool]:
    """(loss_parallel, sequence_parallel) for a tp plan: what torchtitan runs with tp wherever the model allows it
    (the capability table's rows): the LM head and loss split over the vocabulary (an untied head whose vocabulary
    tp divides) and the norms and residual stream over the sequence (the plain column/row layout). Both save memory
    and time in the model (``tp_time.py``); weighing each both ways would cost the search a third more tp plans. A
    pin overrides its own."""
    lp = not stats.facts.tied and stats.vocab % tp == 0
    sp = all(style in PLAIN_TP_STYLES for style in stats.facts.tp_styles)
    return bool(fixed.get("loss_parallel", lp)), bool(fixed.get("sequence_parallel", sp))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def judge(stats: ModelStats, plan: Plan, cluster: Cluster, train: TrainConfig) -> tuple[str | None, str | None]:
    """(why the plan cannot work here, why it is not offered): the capability table's rows for this model and
    workload, and the planner's own rule that tensor parallelism stays inside a node."""
    rejected = None
    if plan.tp > cluster.gpus_per_node:
        rejected = f"tp={plan.tp} crosses node boundary ({cluster.gpus_per_node} GPUs per node)"
    not_offered = None
    for problem in problems(Setup(plan, train, stats.facts)):
        if problem.rule.kind == "not_built":
            not_offered = not_offered or problem.message
        else:
            rejected = rejected or problem.message
    return rejected, not_offered


def _cp_degrees(cluster: Cluster, backend: str, seq_len: int, fixed: dict[str, Any]) -> list[int]:
    """Context-parallel degrees worth weighing: 1, and for long rows (CP_MIN_SEQ_LEN or pinned) the degrees within
    a node that divide the row (the all-to-alls around every attention want the fastest links)."""
    if "cp" in fixed:
        return [fixed["cp"]]
    if backend == "deepspeed" or seq_len < CP_MIN_SEQ_LEN:
        return [1]
    return [d for d in _divisors(cluster.num_gpus) if d <= cluster.gpus_per_node and seq_len % d == 0]


def _layouts(
    stats: ModelStats, cluster: Cluster, backend: str, seq_len: int = 0, fixed: dict[str, Any] | None = None
) -> Iterator[tuple[int, int, int, int, int]]:
    """(dp_replicate, dp_shard, tp, pp, cp) splits of the world for one backend (cp only without tp and pp: the
    capability table's not-built rows)."""
    world = cluster.num_gpus
    for cp in _cp_degrees(cluster, backend, seq_len, fixed or {}):
        for tp in [d for d in _divisors(world // cp) if d <= 2 * cluster.gpus_per_node and (d == 1 or cp == 1)]:
            for pp in _divisors(world // (tp * cp)):
                if pp > stats.layers or (pp > 1 and cp > 1):
                    continue
                dp = world // (tp * pp * cp)
                if backend == "fsdp2":  # HSDP: any split of dp into replicas of shards
                    yield from ((r, dp // r, tp, pp, cp) for r in _divisors(dp))
                elif backend == "ddp":
                    yield dp, 1, tp, pp, cp
                else:
                    yield 1, dp, tp, pp, cp


def _offloads(backend: str) -> list[tuple[bool, bool]]:
    """(offload_optimizer, offload_params) choices: FSDP2 offloads parameters, DeepSpeed the optimizer."""
    if backend == "ddp":
        return [(False, False)]
    return [(False, False), (True, False) if backend == "deepspeed" else (False, True)]


def enumerate_plans(
    stats: ModelStats, cluster: Cluster, global_batch_size: int, fixed: dict[str, Any], seq_len: int = 0
) -> Iterator[Plan]:
    """Every plan that meets the global batch and the pins in ``fixed``.

    Gradient reduction: FSDP2 chooses when it accumulates (without accumulation both modes are the same plan);
    DDP and DeepSpeed have one mode each (see config.plan). The chunked loss (LOSS_CHUNK_TOKENS per chunk) is a
    variant where a row has more tokens than a chunk.
    """
    for backend in BACKENDS:
        default_reduce = DEFAULT_GRAD_REDUCE[backend]
        for replicate, shard, tp, pp, cp in _layouts(stats, cluster, backend, seq_len, fixed):
            micro = [mb for mb in MICRO_BATCHES if global_batch_size % (mb * replicate * shard) == 0]
            schedules = PLANNED_SCHEDULES if pp > 1 else PLANNED_SCHEDULES[:1]
            for mb, ac, stage, schedule, (off_opt, off_par) in itertools.product(
                micro, CHECKPOINTING, ZERO_STAGES[backend], schedules, _offloads(backend)
            ):
                common = dict(
                    backend=backend,
                    zero_stage=stage,
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
                )
                # fsdp2 pipeline stages reduce once, after the last micro-batch (config.plan)
                reduce = "once_per_step" if pp > 1 and backend == "fsdp2" else default_reduce
                plan = Plan(grad_reduce=reduce, **common)
                variants = [plan]
                if backend in CHOOSES_GRAD_REDUCE and pp == 1 and plan.grad_accum_steps(global_batch_size) > 1:
                    variants += [Plan(grad_reduce=mode, **common) for mode in GRAD_REDUCE if mode != reduce]
                if backend == "fsdp2" and tp > 1 and pp == 1:
                    lp, sp = _tp_companions(stats, tp, fixed)
                    variants = [replace(v, loss_parallel=lp, sequence_parallel=sp) for v in variants]
                # full checkpointing of every other block: between none and full in memory and in time
                every = fixed.get("checkpoint_every", 1)
                # (weighed without tp and pp: where rows are long and memory is activations, not model states)
                if ac == "full" and "checkpoint_every" not in fixed and stats.layers >= 4 and tp == pp == 1:
                    variants += [replace(v, checkpoint_every=2) for v in variants]
                elif every > 1:
                    variants = [replace(v, checkpoint_every=every) for v in variants]
                chunk = fixed.get("loss_chunk_tokens", LOSS_CHUNK_TOKENS)
                # weighed for rows longer than a chunk (shorter rows can shrink the micro-batch instead)
                if chunk and tp == 1 and pp == 1 and (seq_len // cp > chunk or "loss_chunk_tokens" in fixed):
                    variants += [replace(v, loss_chunk_tokens=chunk) for v in variants]
                # activation offload: weighed for long rows, where the block inputs of full checkpointing or all
                # a block saves are what does not fit; not with selective or pp (capability table)
                # expert parallelism: for a mixture, on fsdp2 without tp/pp/cp, each ep dividing dp_shard and the
                # experts within a node (the all-to-alls want the fastest links)
                if "ep" in fixed:
                    variants = [replace(v, ep=fixed["ep"]) for v in variants]
                elif stats.num_experts and backend == "fsdp2" and tp == pp == cp == 1:
                    degrees = [e for e in _divisors(shard) if e > 1 and e <= cluster.gpus_per_node]
                    degrees = [e for e in degrees if stats.num_experts % e == 0]
                    variants += [replace(v, ep=e) for v in variants for e in degrees]
                offloads = fixed.get("offload_activations", seq_len // cp >= OFFLOAD_MIN_SEQ_LEN)
                if offloads and ac != "selective" and tp == 1 and pp == 1:
                    variants += [replace(v, offload_activations=True) for v in variants]
                if fixed:
                    variants = [v for v in variants if all(getattr(v, k) == want for k, want in fixed.items())]
                yield from variants


def search(
    stats: ModelStats, cluster: Cluster, workload: Workload, fixed: dict[str, Any] | None = None
) -> list[Candidate]:
    """All candidates, best first: runnable plans that fit, by predicted step time (simplest on near ties); then
    runnable plans that do not fit; then the plans the trainer cannot run yet, ranked the same way among themselves.
    With ``workload.method`` auto, every method's candidates, the preferred method's best first (``rank_methods``)."""
    if workload.method == "auto":
        return rank_methods([search(stats, cluster, replace(workload, method=m), fixed) for m in AUTO_METHODS])
    if workload.compile == "auto" or workload.fp8 == "auto":
        every = [c for w in speed_workloads(workload, cluster) for c in _search_method(stats, cluster, w, fixed or {})]
        return _rank([c for c in every if c.runnable]) + _rank([c for c in every if not c.runnable])
    return _search_method(stats, cluster, workload, fixed or {})


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


def rank_methods(per_method: list[list[Candidate]]) -> list[Candidate]:
    """``train.method: auto``: plans without offload first (offload is the slow way to fit); among them the first
    method of AUTO_METHODS whose best plan fits, full fine-tuning only while its step is at most COMPETITIVE times
    an adapter plan's (it trains every weight, for about 1.5x the FLOPs), LoRA before QLoRA (an exact base). When
    only offloading plans fit, the fastest of them (QLoRA's 4-bit base also moves a quarter of LoRA's bytes over
    PCIe and keeps a quarter in host memory). The rest follow, ranked as ``_rank`` does across methods."""
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
    rest = _rank([c for c in every if c.runnable and c is not chosen])
    return ([chosen] if chosen else []) + rest + _rank([c for c in every if not c.runnable])


def candidate(stats: ModelStats, plan: Plan, cluster: Cluster, workload: Workload) -> Candidate:
    """One plan judged and predicted for ``workload`` on ``cluster``: its memory, whether it fits the GPU's and the
    node's host memory (and why not), whether the trainer runs it; its time on first use."""
    return _Judge(stats, cluster, workload)(plan)


class _Judge:
    """Judges the plans of one search: what every candidate shares is made once (a search judges thousands)."""

    def __init__(self, stats: ModelStats, cluster: Cluster, workload: Workload) -> None:
        self.stats, self.cluster, self.workload = stats, cluster, workload
        self.train = workload.train_config()

    def predict_time(self, plan: Plan) -> TimeEstimate:
        return estimate_time(self.stats, plan, self.cluster, self.workload)

    def __call__(self, plan: Plan) -> Candidate:
        stats, cluster, workload = self.stats, self.cluster, self.workload
        budget = cluster.gpu.memory_bytes
        mem = estimate_memory(stats, plan, workload)
        reason, not_offered = judge(stats, plan, cluster, self.train)
        if reason is None and mem.budget_bytes > budget:
            reason = f"needs {mem.budget_bytes / GiB:.1f} GiB > {budget / GiB:.1f} GiB budget"
        host = host_bytes(stats, plan, workload) * min(cluster.gpus_per_node, cluster.num_gpus)
        if reason is None and host > cluster.host_bytes_per_node:
            reason = (
                f"needs {host / GiB:.0f} GiB of host memory per node for its offload > "
                f"{cluster.host_bytes_per_node / GiB:.0f} GiB (--host-memory)"
            )
        fits = reason is None
        return Candidate(
            plan, mem, fits, reason, not_offered, self.predict_time, workload.method, workload.compile, workload.fp8
        )


def _search_method(stats: ModelStats, cluster: Cluster, workload: Workload, fixed: dict[str, Any]) -> list[Candidate]:
    judge_plan = _Judge(stats, cluster, workload)
    train = judge_plan.train
    out = [judge_plan(p) for p in enumerate_plans(stats, cluster, workload.global_batch_size, fixed, workload.seq_len)]
    if not out:
        pins = ", ".join(f"{k}={v}" for k, v in fixed.items()) or "none"
        if fixed:  # pins that contradict each other, the batch or the model: the words a recipe would get
            plan = resolve_plan(ParallelConfig(**fixed), cluster.num_gpus, train)
            check(Setup(plan, train, stats.facts))
            raise ConfigError(
                f"the pins ({pins}) make a plan bigtrain train runs, but not one the planner searches: it weighs "
                f"pp_schedule {' or '.join(PLANNED_SCHEDULES)} with one stage per rank, micro-batches "
                f"{', '.join(map(str, MICRO_BATCHES))} and tp up to twice the GPUs per node; set such a plan in a "
                "recipe's parallel section"
            )
        raise ConfigError(
            f"no plan meets global batch {workload.global_batch_size} on {cluster.num_gpus} GPUs with pins ({pins}); "
            "use a global batch that is a multiple of the GPU count, or fewer pins"
        )
    return _rank([c for c in out if c.runnable]) + _rank([c for c in out if not c.runnable])


def _rank(candidates: list[Candidate]) -> list[Candidate]:
    """Fitting plans by predicted time (the simplest first among near ties), then the rest. Plans that offload
    activations come after every fitting plan that does not: their PCIe copies are timed by assumption (overlap with
    compute at the datasheet's PCIe rate), not yet measured on a GPU, so they are chosen where they make a job fit."""
    fitting = sorted((c for c in candidates if c.fits), key=lambda c: (c.plan.offload_activations, c.time.step_s))
    if fitting:
        limit = fitting[0].time.step_s * (1 + NEAR_TIE)
        near = [
            c
            for c in fitting
            if c.time.step_s <= limit and c.plan.offload_activations == fitting[0].plan.offload_activations
        ]
        # compile and FP8 count as moving parts too: chosen where they are faster, not on a near tie
        best = min(near, key=lambda c: (complexity(c.plan) + c.compile + 2 * (c.fp8 != "none"), c.time.step_s))
        fitting.remove(best)
        fitting.insert(0, best)
    # rejected: structurally valid ones that only lack memory first, smallest need first
    rejected = sorted(
        (c for c in candidates if not c.fits),
        key=lambda c: ("budget" not in (c.rejected_because or ""), c.memory.budget_bytes),
    )
    return fitting + rejected
