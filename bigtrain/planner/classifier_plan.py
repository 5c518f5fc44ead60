"""Plans for image and sequence classifiers: memory and time of each data-parallel plan, the choice, and the scaling
from 1 GPU to N, the measure data-parallel training is judged by.

Candidates (a convolutional model on GPUs channels-last in all of them): DDP, FSDP2 (zero_stage 2 or 3) and
DeepSpeed ZeRO-1/2/3, each at every micro-batch that divides a
rank's share of the global batch, with and without full activation checkpointing of the blocks for models without
BatchNorm (tp, pp, cp, ep and compile are rows of the capability table for classifiers:
``config/capabilities/classification.py``). Checkpointing costs one more forward of the blocks (4/3 of the
compute). The model's numbers are measured on fake tensors (``classifier_stats.py``).

Memory of rank 0 (Ψ parameters, N data-parallel ranks, a bytes of the compute dtype, b the micro-batch):
- DDP: fp32 weights, fp32 gradients in DDP's buckets (gradient_as_bucket_view), AdamW's two fp32 states: 16Ψ, plus
  the measured activations under autocast (which include the compute-dtype weight copies backward keeps);
- FSDP2: 12Ψ/N of sharded weights and AdamW states; at the start of backward the activations (weights cast, the
  ``cast`` regime), the gathered units (all of them, aΨ, under zero_stage 2, which keeps them to backward; two of the
  largest under 3) and, when accumulating, the sharded fp32 gradients (4Ψ/N); at the optimizer step the gradients
  and AdamW's foreach temporary (8Ψ/N);
- DeepSpeed: as ``deepspeed_memory.py`` counts it for LMs (compute-dtype weights whole under ZeRO-1/2 and a
  partition under 3, 12Ψ/N of master weights and states, a gradient partition, every gradient under ZeRO-1 at the
  end of backward, every gathered weight alive under ZeRO-3 up to its live-parameter limit).
A margin for the CUDA context, NCCL and the allocator is added before comparing with the GPU's memory, as for LMs.

Time: FLOPs per example (measured) at an achievable fraction of the GPU's peak: ACHIEVABLE (0.45, as for LMs) for
transformers, CONV_ACHIEVABLE for convolutional networks, whose small channel counts and memory-bound BatchNorm and
activations keep them far from the matmul peak: 0.20, taken from NVIDIA's published ResNet-50 figure (2,470 images/s
on one A100 80GB with AMP, DeepLearningExamples; 24.5 GFLOP per image forward and backward as measured here is 60
TFLOP/s, 19% of 312). The one-GPU prediction for ResNet-50 is therefore calibrated, not independent; the
scaling is. Gradient traffic: a ring all-reduce of the fp32 gradients (DDP, 2(N-1)/N of 4Ψ bytes), FSDP2's
all-gathers of the compute-dtype weights (two per micro-step under zero_stage 3) and fp32 reduce-scatters, DeepSpeed's
in the compute dtype. It overlaps backward (two thirds of the compute) except EXPOSED_FRACTION of it; what backward
cannot cover is exposed, and the scaling table says from how many GPUs on that happens. A micro-step takes at least
the time the host needs to launch its operators (counted on the fake step, at the GPU's per-operator overhead): what
makes small micro-batches slow.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bigtrain.config.capabilities import Setup, first_problem
from bigtrain.config.capabilities.classification import CHANNELS_LAST
from bigtrain.config.plan import DEFAULT_GRAD_REDUCE, Plan
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.planner.cost import ACHIEVABLE, EXPOSED_FRACTION, FP32_SLOWDOWN, MEMORY_ACHIEVABLE
from bigtrain.planner.deepspeed_memory import DEEPSPEED_MAX_LIVE_PARAMETERS
from bigtrain.planner.hardware import Cluster, link_bandwidth, ring_share, size
from bigtrain.planner.memory_terms import MARGIN_FIXED, MARGIN_FRACTION, MemoryEstimate

if TYPE_CHECKING:  # measured with torch (fake tensors): planning a causal LM imports no torch
    from bigtrain.planner.classifier_stats import ClassifierStats

CONV_ACHIEVABLE = 0.20  # of the datasheet peak, for CNNs (module docstring: NVIDIA's ResNet-50 A100 figure)
BACKWARD_SHARE = 2 / 3  # of a step's compute: what gradient traffic can hide behind
# the plans tried, simplest first: a near tie (NEAR_TIE) goes to the simpler one
BACKENDS = (("ddp", 0), ("fsdp2", 2), ("fsdp2", 3), ("deepspeed", 1), ("deepspeed", 2), ("deepspeed", 3))
NEAR_TIE = 0.01


@dataclass(frozen=True)
class ClassifierTime:
    step_s: float
    compute_s: float
    comm_s: float  # gradient and weight traffic of one step, overlapped or not
    exposed_s: float  # the part of it backward does not hide
    per_s: float  # examples per second over the whole job


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    memory: MemoryEstimate  # other_bytes: gathered weights, buckets, temporaries
    time: ClassifierTime
    fits: bool


def classifier_plan(backend: str, zero_stage: int, dp: int, micro_batch_size: int, checkpointed: bool = False) -> Plan:
    shard = backend != "ddp"
    return Plan(
        backend=backend,
        zero_stage=zero_stage,
        grad_reduce=DEFAULT_GRAD_REDUCE[backend],
        dp_replicate=1 if shard else dp,
        dp_shard=dp if shard else 1,
        tp=1,
        pp=1,
        pp_schedule="1f1b",
        activation_checkpointing="full" if checkpointed else "none",
        micro_batch_size=micro_batch_size,
        offload_optimizer=False,
        offload_params=False,
    )


def trained_and_frozen(stats: ClassifierStats, workload: Workload) -> tuple[int, int]:
    """(parameters trained, with fp32 weights, gradients and AdamW states; parameters frozen, stored in the compute
    dtype): the whole model, or under LoRA its adapters and head beside the frozen base."""
    if workload.method != "lora":
        return stats.params, 0
    return stats.lora_params(workload.lora_rank), stats.params - stats.head_params


def estimate_memory(stats: ClassifierStats, plan: Plan, workload: Workload) -> MemoryEstimate:
    # the ranks the states are sharded over: FSDP2's dp_shard (HSDP replicates over dp_replicate), DeepSpeed's dp
    n = plan.dp_shard if plan.backend == "fsdp2" else plan.dp
    psi, a, b = stats.params, workload.dtype_bytes, plan.micro_batch_size
    t, f = trained_and_frozen(stats, workload)
    weights = 4 * t + a * f  # fp32 trained weights, the frozen base in the compute dtype
    accum = plan.grad_accum_steps(workload.global_batch_size)
    fp32 = workload.mixed_precision == "fp32"
    checkpointed = plan.activation_checkpointing == "full"
    # autocast copies fp32 weights to the compute dtype for backward; a LoRA base is stored in it already
    regime = "autocast" if plan.backend == "ddp" and not f else "cast"
    acts = stats.activations(regime, b, checkpointed)
    if plan.backend == "ddp":
        return _with_margin(weights, 4 * t, 8 * t, acts, 0)
    if plan.backend == "fsdp2":
        gathered = a * psi if plan.zero_stage == 2 else 2 * a * stats.largest_unit
        # a unit's unsharded fp32 gradient, being reduced (its trained share)
        reduce = int(4 * stats.largest_unit * t / psi) if not fp32 else 0
        kept = 4 * t // n if accum > 1 else 0
        backward = acts + gathered + reduce + kept
        step = 8 * t // n
        if backward >= step:
            return _with_margin(weights // n, kept, 8 * t // n, acts, gathered + reduce)
        return _with_margin(weights // n, 4 * t // n, 8 * t // n, 0, 4 * t // n)
    optim = 12 * t // n
    if plan.zero_stage == 3:
        partition = a * t // n
        gathered = a * min(psi, DEEPSPEED_MAX_LIVE_PARAMETERS)
        moments = [(partition, acts, gathered), (partition, 0, 12 * t // n)]
        params = a * psi // n
    else:
        params = a * psi
        partition = a * t // n
        bucket = a * min(t, stats.largest_unit)
        moments = [(partition if accum > 1 else 0, acts, bucket), (partition, 0, 8 * t // n)]
        if plan.zero_stage == 1:
            moments.append((a * t + partition, 0, 0))
    grads, act, other = max(moments, key=sum)
    return _with_margin(params, grads, optim, act, other)


def _with_margin(params: float, grads: float, optim: float, acts: float, other: float) -> MemoryEstimate:
    parts = [int(x) for x in (params, grads, optim, acts, other)]
    return MemoryEstimate(*parts, MARGIN_FIXED + int(MARGIN_FRACTION * sum(parts)))


def estimate_time(stats: ClassifierStats, plan: Plan, cluster: Cluster, workload: Workload) -> ClassifierTime:
    n, psi, a = plan.dp, stats.params, workload.dtype_bytes
    t, frozen = trained_and_frozen(stats, workload)
    accum = plan.grad_accum_steps(workload.global_batch_size)
    rate = cluster.gpu.peak_tflops * 1e12 * (CONV_ACHIEVABLE if stats.convolutional else ACHIEVABLE)
    if workload.mixed_precision == "fp32":
        rate /= FP32_SLOWDOWN
    # each micro-step launches the model's operators whatever its size: the host's launching is the floor of a small
    # micro-step (the GPU waits for kernels), hidden behind a large one (kernels queue while it computes)
    recompute = 4 / 3 if plan.activation_checkpointing == "full" else 1.0  # one more forward of every block
    # a frozen base has no weight gradients: backward computes the input's only (forward + backward: 2 of 3)
    share = 2 / 3 if frozen else 1.0
    compute = share * recompute * stats.flops_per_example * plan.micro_batch_size / rate
    micro_s = max(compute, stats.operators * cluster.gpu.op_overhead_s)
    compute_s = micro_s * accum
    link = link_bandwidth(cluster, n, 1)
    ring = ring_share(n)
    # gradient traffic carries the trained parameters only; FSDP2 and ZeRO-3 gather the whole model
    if plan.backend == "ddp":  # one all-reduce of the fp32 gradients, in the last micro-step's backward
        comm = [(2 * ring * 4 * t / link, micro_s)]
    elif plan.backend == "fsdp2":  # every micro-step: the gathers and the fp32 reduce-scatter
        gathers = 2 if plan.zero_stage == 3 else 1
        comm = [(ring * (gathers * a * psi + 4 * t) / link, micro_s)] * accum
    else:  # DeepSpeed reduces in the compute dtype; its weights are gathered once per step (twice per micro-step
        # under ZeRO-3)
        per_micro = ring * (a * t + (2 * a * psi if plan.zero_stage == 3 else 0)) / link
        comm = [(per_micro, micro_s)] * accum
        if plan.zero_stage < 3:
            comm.append((ring * a * t / link, 0.0))
    traffic = sum(c for c, _ in comm)
    exposed = sum(max(0.0, c - BACKWARD_SHARE * s) + EXPOSED_FRACTION * c for c, s in comm)
    if n == 1:
        traffic = exposed = 0.0
    shards = 1 if plan.backend == "ddp" else n
    optimizer_s = 32 * t / shards / (cluster.gpu.memory_gbps * 1e9 * MEMORY_ACHIEVABLE)  # AdamW reads/writes
    step_s = compute_s + exposed + optimizer_s
    return ClassifierTime(step_s, compute_s, traffic, exposed, workload.global_batch_size / step_s)


def micro_batch_sizes(per_rank: int) -> list[int]:
    """Powers of two that divide a rank's share of the global batch, and the share itself."""
    sizes = {per_rank}
    b = 1
    while b < per_rank:
        if per_rank % b == 0:
            sizes.add(b)
        b *= 2
    return sorted(sizes)


def candidates(stats: ClassifierStats, cluster: Cluster, workload: Workload, fixed: dict[str, Any]) -> list[Candidate]:
    n = cluster.num_gpus
    if workload.global_batch_size % n:
        lower = workload.global_batch_size // n * n
        raise ConfigError(
            f"global_batch_size={workload.global_batch_size} does not divide over {n} GPUs; try "
            f"{lower or n} or {lower + n}"
        )
    out = []
    train, data = workload.train_config(), workload.data_facts()
    # a convolutional model on GPUs trains channels-last: tensor cores' convolutions read NHWC (torchvision's and
    # NVIDIA's reference recipes for AMP); its memory is the same, and its gain is not in the time model
    nhwc = stats.convolutional and cluster.gpu.name != "CPU"
    for backend, stage in BACKENDS:
        for b in micro_batch_sizes(workload.global_batch_size // n):
            for checkpointed in (False, True):
                plan = classifier_plan(backend, stage, n, b, checkpointed)
                plan = plan.with_option(CHANNELS_LAST.name, True) if nhwc else plan
                if any(plan.to_dict().get(k) != v for k, v in fixed.items()):
                    continue
                if stats.blocks == 0 and checkpointed:  # nothing to checkpoint
                    continue
                if first_problem(Setup(plan, train, stats.facts, data)) is not None:  # the table's rows
                    continue
                memory = estimate_memory(stats, plan, workload)
                time = estimate_time(stats, plan, cluster, workload)
                out.append(Candidate(plan, memory, time, memory.budget_bytes <= cluster.gpu.memory_bytes))
    if not out:
        raise ConfigError(f"no classifier plan has {fixed}; classifiers train on backend ddp, fsdp2 or deepspeed")
    return ranked(out)


def ranked(found: list[Candidate]) -> list[Candidate]:
    """Fitting plans first, fastest first; a plan within NEAR_TIE of the fastest but simpler (earlier in BACKENDS,
    then with the larger micro-batch) goes before it."""
    order = {key: i for i, key in enumerate(BACKENDS)}
    fits = [c for c in found if c.fits]
    fastest = min((c.time.step_s for c in fits), default=1.0)
    # steps within 0.1% of each other are the same time: the larger micro-batch first (fewer, larger kernels)
    fits.sort(key=lambda c: (round(c.time.step_s / fastest, 3), -c.plan.micro_batch_size))
    rest = sorted((c for c in found if not c.fits), key=lambda c: c.memory.budget_bytes)
    if fits:
        best = fits[0].time.step_s
        near = [c for c in fits if c.time.step_s <= best * (1 + NEAR_TIE)]
        near.sort(
            key=lambda c: (
                c.plan.activation_checkpointing != "none",
                order[(c.plan.backend, c.plan.zero_stage)],
                -c.plan.micro_batch_size,
            )
        )
        fits = near + [c for c in fits if c not in near]
    return fits + rest


@dataclass(frozen=True)
class ScalingRow:
    gpus: int
    per_s: float  # examples per second over all GPUs
    speedup: float
    efficiency: float
    comm_s: float
    exposed_s: float
    fits: bool  # the plan's memory fits one GPU at this count


def scaling(stats: ClassifierStats, chosen: Plan, cluster: Cluster, workload: Workload) -> list[ScalingRow]:
    """The chosen plan's kind on 1, 2, 4, ... up to the asked GPUs, each GPU with the same share of the batch (the
    micro-batch and accumulation of the chosen plan): examples/s, speed-up over one GPU, and how much gradient
    traffic backward no longer hides."""
    counts, g = [], 1
    while g < cluster.num_gpus:
        counts.append(g)
        g *= 2
    counts.append(cluster.num_gpus)
    per_gpu = workload.global_batch_size // cluster.num_gpus
    rows: list[ScalingRow] = []
    for g in counts:
        c = Cluster(cluster.gpu, g, min(cluster.gpus_per_node, g), cluster.host_memory_bytes)
        w = dataclasses.replace(workload, global_batch_size=per_gpu * g)
        plan = chosen.but(
            dp_replicate=g if chosen.backend == "ddp" else 1, dp_shard=1 if chosen.backend == "ddp" else g
        )
        t = estimate_time(stats, plan, c, w)
        fits = estimate_memory(stats, plan, w).total_bytes <= cluster.gpu.memory_bytes
        one = rows[0].per_s if rows else t.per_s
        rows.append(ScalingRow(g, t.per_s, t.per_s / one, t.per_s / one / g, t.comm_s, t.exposed_s, fits))
    return rows


def plan_name(plan: Plan) -> str:
    name = "ddp" if plan.backend == "ddp" else f"{plan.backend} zero{plan.zero_stage}"
    name += " ac" if plan.activation_checkpointing != "none" else ""
    return name + (" nhwc" if CHANNELS_LAST.of(plan) else "")


def per_backend(found: list[Candidate]) -> list[Candidate]:
    """The best candidate of each backend, stage and checkpointing (its best micro-batch), in the ranking's order."""
    seen, out = set(), []
    for cand in found:
        key = (cand.plan.backend, cand.plan.zero_stage, cand.plan.activation_checkpointing)
        if key not in seen:
            seen.add(key)
            out.append(cand)
    return out


def table_lines(found: list[Candidate], workload: Workload, unit: str) -> list[str]:
    """The candidates, one row per backend (its best micro-batch): memory per GPU, step time, throughput."""
    lines = [
        f"  {'#':>2}  {'plan':<24} {'micro':>5} {'accum':>5}  {'memory/GPU':>10}  {'step':>9}  {unit + '/s':>10}  fits"
    ]
    for i, cand in enumerate(per_backend(found), 1):
        accum = cand.plan.grad_accum_steps(workload.global_batch_size)
        lines.append(
            f"  {i:>2}  {plan_name(cand.plan):<24} {cand.plan.micro_batch_size:>5} {accum:>5}  "
            f"{size(cand.memory.budget_bytes):>10}  {cand.time.step_s * 1e3:>7.1f} ms  {cand.time.per_s:>10,.0f}  "
            f"{'yes' if cand.fits else 'no'}"
        )
    return lines
