"""The memory and time terms of image and sequence classifiers, for the one search (``search.py``) every task plans
through (``classifier_model``: the ``PlannedModel`` a classifier's spec hands it).

What the terms describe (``describes``; the search offers nothing else for a classifier): DDP, FSDP2 (zero_stage 2
or 3, one replica group) and DeepSpeed ZeRO-1/2/3, at every micro-batch that divides a rank's share of the global
batch (powers of two and the share itself), with and without full activation checkpointing of the blocks, no
offload (tp, pp, cp, ep, FP8 and QLoRA are rows of the classification tasks' specs: ``tasks/classifiers.py``; the
BatchNorm rows are ``config/capabilities/batch_norm.py``'s; a convolutional model on GPUs is channels-last in all of
them, ``config/capabilities/channels_last.py``). Checkpointing costs one more forward of the blocks (4/3 of the
compute). The model's numbers are measured on fake tensors (``classifier_stats.py``).

Memory of rank 0 (Ψ parameters, N data-parallel ranks, a bytes of the compute dtype, b the micro-batch):
- DDP: fp32 weights, fp32 gradients in DDP's buckets (gradient_as_bucket_view), AdamW's two fp32 states: 16Ψ, plus
  the measured activations under autocast (which include the compute-dtype weight copies backward keeps);
- FSDP2: 12Ψ/N of sharded weights and AdamW states; in backward, block by block from the last, the activations not
  yet released (weights cast, the ``cast`` regime; each block's measured share released as its backward ends), the
  gathered units (the root's own throughout; under zero_stage 2 every block not yet through backward, which it keeps
  gathered from forward; under 3 the block computing and the one prefetched), the previous block's unsharded fp32
  gradient being reduced, and the sharded fp32 gradients: of the blocks through backward, or all of them (4Ψ/N) when
  accumulating; at the optimizer step the gradients and AdamW's foreach temporary (8Ψ/N). Backward's peak is where
  these sum largest: its start for equal blocks; FLUX's large double-stream blocks come first, so its peak is among
  the single-stream ones backward starts with;
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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bigtrain.config.plan import DEFAULT_GRAD_REDUCE, Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.cost import ACHIEVABLE, EXPOSED_FRACTION, FP32_SLOWDOWN, MEMORY_ACHIEVABLE, TimeEstimate
from bigtrain.planner.deepspeed_memory import DEEPSPEED_MAX_LIVE_PARAMETERS
from bigtrain.planner.hardware import Cluster, count, link_bandwidth, ring_share
from bigtrain.planner.memory_terms import MARGIN_FIXED, MARGIN_FRACTION, MemoryEstimate
from bigtrain.planner.planned import PlannedModel
from bigtrain.planner.preference import as_rows

if TYPE_CHECKING:  # measured with torch (fake tensors): planning a causal LM imports no torch
    from bigtrain.planner.classifier_record import ClassifierStats

CONV_ACHIEVABLE = 0.20  # of the datasheet peak, for CNNs (module docstring: NVIDIA's ResNet-50 A100 figure)
BACKWARD_SHARE = 2 / 3  # of a step's compute: what gradient traffic can hide behind


@dataclass(frozen=True)
class ClassifierTime:
    step_s: float
    compute_s: float
    comm_s: float  # gradient and weight traffic of one step, overlapped or not
    exposed_s: float  # the part of it backward does not hide
    per_s: float  # examples per second over the whole job


def trained_and_frozen(stats: ClassifierStats, workload: Workload) -> tuple[int, int]:
    """(parameters trained, with fp32 weights, gradients and AdamW states; parameters frozen, stored in the compute
    dtype): the whole model, or under LoRA its adapters and head beside the frozen base."""
    if workload.method != "lora":
        return stats.params, 0
    return stats.lora_params(workload.lora_rank), stats.params - stats.head_params


def estimate_memory(stats: ClassifierStats, plan: Plan, workload: Workload) -> MemoryEstimate:
    plan, workload = as_rows(plan, workload)  # a reward model's pair: two rows
    # the ranks the states are sharded over: FSDP2's dp_shard (HSDP replicates over dp_replicate), DeepSpeed's dp
    n = plan.dp_shard if plan.backend == "fsdp2" else plan.dp
    psi, a, b = stats.params, workload.dtype_bytes, plan.micro_batch_size
    t, f = trained_and_frozen(stats, workload)
    weights = 4 * t + a * f  # fp32 trained weights, the frozen base in the compute dtype
    accum = plan.grad_accum_steps(workload.global_batch_size)
    checkpointed = plan.activation_checkpointing == "full"
    # autocast copies fp32 weights to the compute dtype for backward; a LoRA base is stored in it already, and
    # backward keeps only what the adapted linears' and the head's gradients read
    regime = "lora" if f else "autocast" if plan.backend == "ddp" else "cast"
    acts = stats.activations(regime, b, checkpointed)
    if plan.backend == "ddp":
        return _with_margin(weights, 4 * t, 8 * t, acts, 0)
    if plan.backend == "fsdp2":
        kept = 4 * t // n if accum > 1 else 0  # the sharded fp32 gradients between micro-steps
        moments = _fsdp2_backward(stats, plan.zero_stage, a, t, b, regime, checkpointed, 0 if kept else n)
        acts_held, other = max(moments, key=sum)
        if acts_held + other + kept >= 8 * t // n:
            return _with_margin(weights // n, kept, 8 * t // n, acts_held, other)
        # at the optimizer step: the gradients and AdamW's foreach temporary
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


def _fsdp2_backward(
    stats: ClassifierStats, zero_stage: int, a: int, t: int, b: int, regime: str, checkpointed: bool, n: int
) -> list[tuple[float, float]]:
    """(activations, gathered weights and gradients being reduced) while FSDP2's backward runs each block, from the
    last, and at its end: the activations not yet released (a block's share goes when its backward ends; under
    checkpointing, the block's inputs, while the largest block's recompute is counted throughout), the root's own
    parameters (gathered from forward to the end of backward), under zero_stage 3 the block computing and the one
    prefetched, under 2 every block not yet through backward, the unsharded fp32 gradient of the block before (in
    backward's order) being reduced, its trained share, and the sharded gradients of the blocks through backward
    (``n`` ranks; 0: kept whole from the micro-step before: the caller counts them). bench/diffusion_memory.py's
    simulated FLUX steps hold these at their peaks."""
    units, psi = stats.units, stats.params
    shares = stats.checkpointed_shares if checkpointed else stats.unit_shares
    root = psi - sum(units)
    grad = 0.0 if a == 4 else 4 * t / psi  # fp32 training reduces the gradient it computed: no copy
    acts = stats.activations(regime, b, checkpointed)
    per_example = acts - stats.activations(regime, 0, checkpointed)
    sharded_per_param = 4 * t / psi / n if n else 0.0  # a block's sharded fp32 gradient, per parameter
    moments = []
    for k in reversed(range(-1, len(units))):  # -1: every block through backward, the root's own next
        released = per_example * sum(shares[k + 1 :])
        if k < 0:
            blocks = 0
        elif zero_stage == 2:
            blocks = sum(units[: k + 1])
        else:
            blocks = units[k] + (units[k - 1] if k else 0)
        reduced = units[k + 1] if k + 1 < len(units) else 0  # the later block's, its activations released
        done = sharded_per_param * sum(units[k + 1 :])
        moments.append((acts - released, a * (root + blocks) + grad * reduced + done))
    # the root's gradient comes last, when the activations are gone
    moments.append((0.0, a * root + grad * root + sharded_per_param * sum(units)))
    return moments


def _with_margin(params: float, grads: float, optim: float, acts: float, other: float) -> MemoryEstimate:
    parts = [int(x) for x in (params, grads, optim, acts, other)]
    return MemoryEstimate(*parts, MARGIN_FIXED + int(MARGIN_FRACTION * sum(parts)))


def estimate_time(stats: ClassifierStats, plan: Plan, cluster: Cluster, workload: Workload) -> ClassifierTime:
    plan, workload = as_rows(plan, workload)  # a reward model's pair: two rows (its answers per second)
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


def micro_batch_sizes(per_rank: int) -> tuple[int, ...]:
    """Powers of two that divide a rank's share of the global batch, and the share itself."""
    sizes = {per_rank}
    b = 1
    while b < per_rank:
        if per_rank % b == 0:
            sizes.add(b)
        b *= 2
    return tuple(sorted(sizes))


def step_time(stats: ClassifierStats, plan: Plan, cluster: Cluster, workload: Workload) -> TimeEstimate:
    """``estimate_time`` as the search reads a step: seconds, examples per second per device, MFU, the compute and
    the communication backward does not hide (``comm_s``)."""
    t = estimate_time(stats, plan, cluster, workload)
    per_device = t.per_s / plan.dp
    peak = cluster.gpu.peak_tflops * 1e12
    mfu = stats.flops_per_example * per_device / peak if peak else 0.0
    # what is not communication left exposed is compute (the optimizer's step included)
    return TimeEstimate(t.step_s, per_device, mfu, t.step_s - t.exposed_s, t.exposed_s)


def describes(stats: ClassifierStats) -> Any:
    """The plans these terms describe (module docstring): data parallelism on one replica group (DDP replicates),
    every block checkpointed or none (none for a model without blocks), nothing offloaded, the backend's own
    gradient reduction, one loss."""
    checkpointing = ("none", "full") if stats.blocks else ("none",)

    def described(plan: Plan) -> bool:
        return (
            plan.activation_checkpointing in checkpointing
            and plan.checkpoint_every == 1
            and (plan.backend == "ddp" or plan.dp_replicate == 1)
            and not (plan.offload_params or plan.offload_optimizer or plan.offload_activations)
            and plan.grad_reduce == DEFAULT_GRAD_REDUCE[plan.backend]
            and plan.loss_chunk_tokens == 0
        )

    return described


def headline(stats: ClassifierStats, workload: Workload) -> str:
    """The plan table's words for a classifier: what an example is, its parameters and FLOPs, what LoRA trains."""
    unit = stats.unit
    words = (
        f"model {stats.describe}: {count(stats.params)} params, {_gflop(stats.flops_per_example)} GFLOP per "
        f"{unit[:-1]} (forward + backward)"
    )
    if workload.method == "lora":
        words += f"; LoRA r={workload.lora_rank}: {count(stats.lora_params(workload.lora_rank))} trained"
    return words


def summary(stats: ClassifierStats) -> dict[str, Any]:
    return {
        "model_type": stats.model_type,
        "task": stats.task,
        "params": stats.params,
        "example": stats.example,
        "flops_per_example": stats.flops_per_example,
    }


def _gflop(flops: float) -> str:
    return f"{flops / 1e9:,.0f}" if flops >= 1e11 else f"{flops / 1e9:.3g}"


def classifier_model(model_config: dict[str, Any], workload: Workload, with_text: bool = False) -> PlannedModel:
    """A classifier (its config dict names its class) as the search weighs it, measured at the workload's image
    size (image classifiers) or row length (sequence classifiers) and precision; ``with_text``: at both (a
    diffusion transformer reads an image's tokens and its caption's)."""
    from bigtrain.planner.known_configs import recorded_classifier

    side, job = workload.image_size, workload.job
    size = (side, workload.seq_len if with_text or not side else 0, workload.mixed_precision)
    stats = recorded_classifier(model_config, *size)  # a preset at its default size: no torch, no measuring
    if stats is None or (stats.task, stats.unit) != (job.task, job.unit):
        from bigtrain.planner.classifier_stats import measure_classifier

        method = {"full": "full", "lora": "lora", "qlora": "lora"}.get(workload.method)  # auto: every regime
        stats = measure_classifier(model_config, *size, job.task, job.unit, method)
    return PlannedModel(
        stats,
        estimate_memory,
        step_time,
        lambda stats, plan, workload: 0,
        micro_batches=micro_batch_sizes,
        model_parallel=False,
        describes=describes(stats),
        headline=headline,
        summary=summary,
        scaling_view=True,
        lm_notes=False,
    )
