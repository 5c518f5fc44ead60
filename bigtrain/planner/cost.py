"""Predicted time of one optimizer step for one plan, and the throughput and MFU that follow.

Compute: training FLOPs = 6·N·tokens (Kaplan et al. 2020: 2 for forward, 4 for backward per parameter and token,
N = matmul parameters, i.e. blocks + LM head, not the embedding lookup) plus attention scores 12·layers·L·d per
token (PaLM, Chowdhery et al. 2022, appendix B, d = query width). Recompute adds a forward: 2·N + 4·layers·L·d per
token under full checkpointing, the attention part only under selective. Time = FLOPs / (peak · ACHIEVABLE), with
ACHIEVABLE = 0.45 of the datasheet peak for large bf16 matmuls (typical MFU of well-tuned FSDP runs reported by
torchtitan, 2024), and fp32 runs at 1/8 of it (no tensor-core bf16 path; TF32 assumed off for exactness).
Small micro-batches use the GPU less well (kernel launch and tile quantisation overheads are paid per micro-step):
efficiency is scaled by t / (t + HALF_EFFICIENCY_TOKENS) for t tokens per micro-batch (0.89 at 2048 tokens,
0.33 at 128): an assumption to be calibrated on real GPUs, which mainly makes larger micro-batches win ties.
Communication (ring collectives move (n-1)/n of the buffer per rank; an all-reduce is twice that):
- ddp: all-reduce of fp32 gradients once per step (2Ψ·4 bytes).
- fsdp2 ZeRO-3: all-gather of compute-dtype parameters in forward and again in backward per micro-step; ZeRO-2
  mode gathers once per micro-step. Gradients: one fp32 reduce-scatter per micro-step with ``grad_reduce:
  every_micro_step``, one per step with ``once_per_step``. HSDP adds one all-reduce of the sharded gradients across
  replicas per step in both modes (FSDP2 defers it to the last micro-step).
- deepspeed: ZeRO-1/2 reduce-scatter gradients and all-gather updated parameters (2Ψ·a); ZeRO-3 also gathers in
  forward and backward (3Ψ·a, the ZeRO paper's 1.5x of data parallelism).
- ep: two all-to-alls of top_k·b·L·h values per block with routed experts and pass (forward, backward,
  recompute), not overlapped; each expert gathered and reduced over the dp_shard / ep ranks that hold it.
- tp (``tp_time.py``): 2 all-reduces of b·L·h activations per layer and pass (Megatron-LM), each with the link's
  latency, not overlapped; the sliced projections at their measured (slower) rates, the LM head repeated on every
  tp rank, and DTensor's per-block machinery, all measured by ``bigtrain probe``.
- pp: one activation send per micro-batch and direction; bubble (p-1)/(v·m+p-1) of the pipeline time (v = virtual
  stages per rank); not yet measured on GPUs (no multi-GPU machine has been available).
- offload: host<->device copies over PCIe, and the optimizer step on the CPU at CPU_ADAM_PARAMS_PER_S per GPU;
  activation offload's copies run beside compute, only what compute does not hide counts
  (``activation_offload_seconds``).
Adapter methods (lora, qlora; ``adapter_memory.py``): 4N + 6Ψ_a FLOPs per token, the base gathered in its storage
dtype (NF4 under QLoRA), only the adapters' gradients reduced and updated, and QLoRA's dequantisation timed at
MEMORY_ACHIEVABLE of the datasheet memory bandwidth (or the probed one).
A group of ranks that spans nodes runs at the per-GPU inter-node bandwidth, otherwise at NVLink/PCIe bandwidth.
With a hardware profile from ``bigtrain probe`` (``profile.py``) the compute rate is the measured matmul rate at the
nearest shape (replacing ACHIEVABLE, FP32_SLOWDOWN and the saturation) and the in-node bandwidth the measured one;
what is not a matmul is then timed at the measured memory bandwidth (``memory_bound_bytes``): the element-wise ops
of each block, the loss over the logits and the AdamW step. On a CPU profile no communication is overlapped.
Floor: each micro-step launches OPS_PER_BLOCK operators per block at the GPU's ``op_overhead_s`` (5 us: launch and
eager dispatch), so that a tiny model is not predicted at microseconds per step.
Overlap: data-parallel traffic is overlapped with compute except EXPOSED_FRACTION of it (prefetch and bucketing leave
the first gather and last reduction exposed); tp, pp and offload traffic is not overlapped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from bigtrain.config.capabilities import CAPABILITIES
from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner import tp_time
from bigtrain.planner.adapter_memory import adapter_flops_per_token, base_bytes, dequant_bytes, trained_params
from bigtrain.planner.hardware import Cluster, link_bandwidth, ring_share
from bigtrain.planner.memory_terms import offloaded_block_bytes, rank_seq_len, stage_layers, stage_params, state_shards
from bigtrain.planner.model_stats import ModelStats
from bigtrain.planner.preference import as_rows
from bigtrain.planner.profile import measured_rate, measured_row
from bigtrain.planner.replica_sync_time import link_latency_seconds, outer_wait_per_step, pipeline_hop_seconds

ACHIEVABLE = 0.45
FP32_SLOWDOWN = 8.0
EXPOSED_FRACTION = 0.10
CPU_ADAM_PARAMS_PER_S = 1.0e9  # DeepSpeed CPU-Adam order of magnitude per GPU's share of host cores
OPS_PER_BLOCK = 60  # operators one decoder block launches per micro-step in eager mode (~20 forward, ~40 backward)
HALF_EFFICIENCY_TOKENS = 256  # tokens per micro-batch at which the GPU reaches half its large-matmul efficiency
# train.compile, from the H100 runs (bench/results/side_by_side_h100.md, with bigtrain probe's H100 profile): inductor
# fuses each block's element-wise chains (a third of eager's passes, and a third of its operators launched) and the
# compiled loss moves ~8 bytes per logit (bf16 logits read twice, their gradient written, one log-sum-exp per row)
# against eager's 40.
COMPILED_ELEMENTWISE_SHARE = 1 / 3
COMPILED_LOSS_BYTES_PER_LOGIT = 8.0
# train.fp8: each float8 linear casts its input (forward) and its output gradient (backward) with scales from amax
# passes, rowwise along both axes for the weight gradient. Per element of those tensors: a bytes (eager: 2a, the amax
# read apart) plus FP8_CAST_EXTRA_BYTES, an effective figure fitted to the H100 runs, not an itemised count: with 3
# (one float8 write and a transposed copy) the model predicted 27% under the measured fp8 step at 1B while it is 14%
# under for bf16 compile; 12 puts both at the same ratio (rowwise, compiled, 1B and Llama-3-8B's width).
FP8_CAST_EXTRA_BYTES = 12
MEMORY_ACHIEVABLE = 0.7  # of the datasheet memory bandwidth, for streaming element-wise work (QLoRA's dequantisation)


@dataclass(frozen=True)
class TimeEstimate:
    step_s: float
    tokens_per_s_per_device: float
    mfu: float
    compute_s: float
    comm_s: float
    link_wait_s: float = 0.0  # of step_s, what the slow link between replica groups costs (0 without one)
    # seconds of a step's phases where it has several (online RL: one generation's prefill, decode and old
    # log-probabilities, and the training step), in order
    phases: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(
            step_s=self.step_s, tokens_per_s_per_device=self.tokens_per_s_per_device, mfu=self.mfu
        )
        return {**out, "phases": dict(self.phases)} if self.phases else out  # online RL: seconds per phase


def model_flops_per_token(stats: ModelStats, seq_len: int, workload: Workload | None = None) -> float:
    """Training FLOPs per token (module docstring); adapter methods skip the base's weight gradients."""
    if workload is not None and workload.adapters:
        return adapter_flops_per_token(stats, seq_len, workload)
    # 2 forward + 4 backward per matmul parameter a token goes through, i.e. three forwards
    return 3.0 * stats.layers * stats.block_forward_flops(seq_len) + 6.0 * stats.vocab * stats.hidden


def recomputed_share(stats: ModelStats, plan: Plan) -> float:
    """The share of decoder blocks that activation checkpointing wraps (parallel.checkpoint_every)."""
    return math.ceil(stats.layers / plan.checkpoint_every) / stats.layers


def elementwise_forward_bytes(stats: ModelStats, plan: Plan, a: int) -> float:
    """Bytes the element-wise ops of one block's forward move per token (``memory_bound_bytes``' count)."""
    h, f = stats.hidden, stats.ffn
    whole = 42 * a * h / (plan.tp if plan.sequence_parallel else 1)
    return whole + (19 * a * h + 5 * a * f) / plan.tp


def fp8_peak(cluster: Cluster, recipe: str, micro_tokens: int, saturation: float) -> float:
    """FLOP/s of the float8 matmuls: with a probed profile, the bf16 rate at ``micro_tokens`` times the FP8/bf16
    ratio the probe measured at the FP8 product's own shape (the probe's FP8 shapes start at 8192 rows: a small
    micro-batch must not be compared with a large FP8 product); else the datasheet's FP8 peak at the bf16 path's
    achievable fraction; 0 on a GPU without FP8."""
    fp8 = measured_row(cluster.gpu, f"fp8-{recipe}", micro_tokens)
    if fp8 is not None:
        same_shape, here = measured_rate(cluster.gpu, "bf16", fp8[0]), measured_rate(cluster.gpu, "bf16", micro_tokens)
        if same_shape and here:
            return here * fp8[1] / same_shape * 1e12
        return fp8[1] * 1e12
    return cluster.gpu.fp8_tflops * 1e12 * ACHIEVABLE * saturation


def fp8_seconds_saved(
    stats: ModelStats, cluster: Cluster, workload: Workload, micro_tokens: int, saturation: float, peak: float
) -> float:
    """train.fp8: the seconds the step's projections (all blocks, all tokens) save at the FP8 rate over ``peak``;
    attention scores and the LM head stay at ``peak``. 0 without FP8 or on a GPU without it."""
    if workload.fp8 == "none":
        return 0.0
    fp8_rate = fp8_peak(cluster, workload.fp8, micro_tokens, saturation)
    if not fp8_rate:
        return 0.0
    seq_len = workload.seq_len
    linear = 3.0 * stats.layers * (stats.block_forward_flops(seq_len) - stats.attention_forward_flops(seq_len))
    return linear * workload.tokens * (1 / peak - 1 / fp8_rate)


def fp8_cast_bytes(stats: ModelStats, plan: Plan, tokens: float, a: int, workload: Workload) -> float:
    """Bytes train.fp8's casts move in one step on one rank (FP8_CAST_EXTRA_BYTES): per token and block, the inputs
    of the seven projections (q, k, v, gate, up: the hidden state each; o: the attention output; down: the
    intermediate) and their output gradients, split by tp."""
    if workload.fp8 == "none":
        return 0.0
    h, f, kv = stats.hidden, stats.ffn, stats.kv_width
    elements = (6 * h + f) + (3 * h + 2 * kv + 2 * f)
    per_element = (a if workload.compile else 2 * a) + FP8_CAST_EXTRA_BYTES
    passes = 1 + (recomputed_share(stats, plan) if plan.activation_checkpointing == "full" else 0)
    return per_element * elements / plan.tp * passes * stage_layers(stats, plan.pp) * tokens


def tp_matmul_seconds(
    stats: ModelStats, plan: Plan, cluster: Cluster, workload: Workload, micro_tokens: int, recomputed: float
) -> float:
    """FLOPs per token (of the whole step, like ``model_flops_per_token``) that tp's ranks spend beyond an even
    1/tp share: the measured slowdown of the sliced projections and the LM head each rank keeps whole
    (``tp_time.py``); 0 without tp."""
    if plan.tp == 1:
        return 0.0
    passes = 2.0 if workload.adapters else 3.0  # adapters skip the base's weight gradients
    slowdown = tp_time.projection_slowdown(stats, cluster.gpu, plan.tp, micro_tokens)
    projections = stats.layers * tp_time.projection_flops_per_token(stats) * (passes + recomputed)
    head = passes * 2.0 * stats.vocab * stats.hidden
    return (slowdown - 1.0) * projections + tp_time.replicated_head_flops(stats, plan, head)


def memory_bound_bytes(
    stats: ModelStats, plan: Plan, tokens: float, a: int, trained: float | None = None, compiled: bool = False
) -> float:
    """Bytes one rank's element-wise work moves in one step (reads + writes), for ``tokens`` tokens of that rank.

    Per token and block, counted pass by pass over HF's Llama block in eager mode, in units of a (the compute
    dtype's bytes): two RMSNorms (upcast, square, mean, scale, downcast, weight: ~18 passes over h each, 36a·h) and
    two residual adds (6a·h), which see the whole hidden state on every tp rank unless sequence parallelism splits
    them; RoPE on q and k (~13 passes over the q and kv widths, ~16a·h for 4 query heads per KV head) and the q/k/v
    layout copies (3a·h), SwiGLU (silu and product: 5 passes over the intermediate width, 5a·f), split by tp.
    Backward moves about twice the forward's bytes; full checkpointing repeats the forward. The loss: ~40 bytes per
    logit (fp32 upcast, log-softmax, its backward, the downcast). AdamW: 28 bytes per fp32 parameter of the rank's
    shard (reads p, g, m, v; writes p, m, v); none on the device when the optimizer is offloaded. ``compiled``
    (train.compile): COMPILED_ELEMENTWISE_SHARE of the blocks' bytes, COMPILED_LOSS_BYTES_PER_LOGIT for the loss.
    """
    layers = stage_layers(stats, plan.pp)
    forward = elementwise_forward_bytes(stats, plan, a)
    passes = 3 + (recomputed_share(stats, plan) if plan.activation_checkpointing != "none" else 0)
    elementwise = passes * forward * layers * tokens * (COMPILED_ELEMENTWISE_SHARE if compiled else 1.0)
    per_logit = COMPILED_LOSS_BYTES_PER_LOGIT if compiled and not plan.loss_chunk_tokens else 40.0
    loss = per_logit * stats.vocab / (plan.tp if plan.loss_parallel else 1) * tokens
    blocks, root = stage_params(stats, plan)
    offloaded = plan.offload_params or plan.offload_optimizer
    updated = blocks + root if trained is None else trained
    optimizer = 0.0 if offloaded else 28.0 * updated / state_shards(plan)
    return elementwise + loss + optimizer


def _offload_seconds(
    stats: ModelStats,
    plan: Plan,
    cluster: Cluster,
    workload: Workload,
    micro_batches: int,
    volumes: tuple[float, float, float],
) -> float:
    """Host<->device copies over PCIe and the optimizer step on the CPU; ``volumes``: (parameters, bytes gathered,
    parameters reduced) of the rank's stage (see ``estimate_time``)."""
    psi, gathered, reduced = volumes
    offload = 0.0
    pcie = cluster.gpu.pcie_gbps * 1e9
    shard = state_shards(plan)
    if plan.offload_params and workload.adapters:  # the base's shards in, the adapters' gradients out, CPU AdamW
        offload += (2 * micro_batches * gathered / shard + 4 * reduced / shard) / pcie
        offload += reduced / shard / CPU_ADAM_PARAMS_PER_S
    elif plan.offload_params:
        offload += (2 * micro_batches * 4 * psi / shard + 4 * psi / shard) / pcie + psi / shard / CPU_ADAM_PARAMS_PER_S
    if plan.offload_optimizer:
        updated = reduced if workload.adapters else psi
        offload += 2 * 2 * updated / shard / pcie + updated / shard / CPU_ADAM_PARAMS_PER_S
    return offload


def ep_all_to_all_seconds(
    stats: ModelStats, plan: Plan, cluster: Cluster, seq_len: int, a: int, micro_batches: int
) -> float:
    """Expert parallelism's exchanges, on the critical path (the experts wait for their tokens): per block with
    routed experts and pass, each of a micro-batch's top_k·b·L (token, expert) pairs goes to its expert's rank and
    its output comes back (two all-to-alls of top_k·b·L·h values; a rank keeps 1/ep of them, the routing assumed
    evenly loaded); forward, backward (the reverse exchanges) and full checkpointing's recompute."""
    if plan.ep == 1:
        return 0.0
    passes = 2 + (recomputed_share(stats, plan) if plan.activation_checkpointing == "full" else 0)
    pairs = stats.top_k * plan.micro_batch_size * seq_len
    per_block = 2 * ring_share(plan.ep) * a * pairs * stats.hidden
    return passes * micro_batches * stats.routed_layers * per_block / link_bandwidth(cluster, plan.ep, 1)


def cp_all_to_all_seconds(
    stats: ModelStats, plan: Plan, cluster: Cluster, seq_len: int, a: int, micro_batches: int
) -> float:
    """Context parallelism's exchanges, on the critical path (attention waits for them): per block and pass, q, k, v
    and the output cross the cp group by all-to-all (each rank keeps 1/cp of its slice's bytes); forward, backward
    (the reverse exchanges) and full checkpointing's recompute."""
    if plan.cp == 1:
        return 0.0
    local_tokens = plan.micro_batch_size * seq_len // plan.cp
    per_block = a * local_tokens * (2 * stats.q_width + 2 * stats.kv_width) / plan.tp
    passes = 3 if plan.activation_checkpointing == "full" else 2
    volume = stage_layers(stats, plan.pp) * passes * micro_batches * per_block * ring_share(plan.cp)
    return volume / link_bandwidth(cluster, plan.cp, plan.tp)


def activation_offload_seconds(
    stats: ModelStats, plan: Plan, cluster: Cluster, seq_len: int, a: int, micro_batches: int, compute: float
) -> float:
    """``offload_activations``: what each micro-batch's blocks offload (``offloaded_block_bytes``) crosses PCIe out
    during the forward and back during the backward, on a side stream beside compute: the part the forward (a third
    of the step's compute) or the backward and its recompute (the other two thirds) does not hide is exposed. Where
    copies do not run beside compute (a CPU host), all of it."""
    if not plan.offload_activations:
        return 0.0
    moved = micro_batches * offloaded_block_bytes(stats, plan, rank_seq_len(plan, seq_len), a, stage_layers(stats, 1))
    one_way = moved / (cluster.gpu.pcie_gbps * 1e9)
    if not cluster.gpu.overlaps_comm:
        return 2 * one_way
    return max(0.0, one_way - compute / 3) + max(0.0, one_way - 2 * compute / 3)


def _data_parallel_seconds(
    stats: ModelStats,
    plan: Plan,
    cluster: Cluster,
    workload: Workload,
    micro_batches: int,
    psi: float,
    gathered: float,
    reduced: float,
) -> float:
    """Data-parallel traffic of one step (what the backward can overlap): DDP's all-reduce, FSDP2's gathers and
    reduce-scatters (and HSDP's all-reduce across replicas), DeepSpeed ZeRO's. ``gathered``: bytes of parameters
    gathered per pass; ``reduced``: parameters whose gradients are reduced (fp32). Semi-synchronous replica groups
    reduce within a group only (their outer synchronisation is timed apart, ``replica_sync_time``)."""
    if settings_of(plan).semi_synchronous:
        plan = plan.but(dp_replicate=1)
    a = workload.dtype_bytes
    # rank order is (pp, dp_replicate, dp_shard, cp, tp) with tp innermost, as torchtitan lays out its mesh; FSDP2
    # shards over dp_shard x cp
    shards = plan.dp_shard * plan.cp
    dp_overlapped = 0.0
    if plan.backend == "ddp":
        # DDP all-reduces over every rank that sees different tokens (dp x cp)
        ranks = plan.dp * plan.cp
        dp_overlapped = 2 * ring_share(ranks) * 4 * reduced / link_bandwidth(cluster, ranks, plan.tp)
    elif plan.backend == "fsdp2":
        dp_overlapped = _fsdp2_seconds(plan, cluster, micro_batches, gathered, reduced, shards, plan.tp)
    else:  # deepspeed; with adapters, ZeRO-3 gathers the base twice and only the adapters are reduced and updated
        if workload.adapters:
            volume = (2 * gathered if plan.zero_stage >= 3 else 0.0) + 2 * a * reduced
        else:
            volume = (3 if plan.zero_stage >= 3 else 2) * a * psi
        dp_overlapped = ring_share(plan.dp) * volume / link_bandwidth(cluster, plan.dp, plan.tp)
    return dp_overlapped + link_latency_seconds(stats, plan, cluster, micro_batches, 4 * reduced)


def _fsdp2_seconds(
    plan: Plan, cluster: Cluster, micro_batches: int, gathered: float, reduced: float, shards: int, stride: int
) -> float:
    """FSDP2's traffic for parameters sharded over ``shards`` ranks ``stride`` apart: ``gathered`` bytes all-gathered
    per micro-step (in forward, and again in backward under ZeRO-3), ``reduced`` fp32 gradients reduce-scattered
    every micro-step or once per step, and all-reduced across HSDP replicas."""
    gathers = 2 if plan.zero_stage == 3 else 1
    reduces = micro_batches if plan.grad_reduce == "every_micro_step" else 1
    volume = gathers * micro_batches * gathered + reduces * 4 * reduced
    seconds = ring_share(shards) * volume / link_bandwidth(cluster, shards, stride)
    rep_bw = link_bandwidth(cluster, plan.dp_replicate, stride * shards)
    return seconds + 2 * ring_share(plan.dp_replicate) * 4 * reduced / shards / rep_bw


def _pipeline_seconds(plan: Plan, cluster: Cluster, micro_batches: int, activation_bytes: float) -> float:
    """A pipeline's sends: an activation and a gradient per micro-batch between neighbouring stages (over the slow
    link where stages sit on both sides of it)."""
    if plan.pp == 1:
        return 0.0
    hop = pipeline_hop_seconds(plan, cluster, micro_batches, activation_bytes)
    return hop or 2 * micro_batches * activation_bytes / plan.tp / link_bandwidth(cluster, 2, plan.tp * plan.dp)


def _expert_fsdp_seconds(plan: Plan, cluster: Cluster, micro_batches: int, gathered: float, reduced: float) -> float:
    """FSDP2's traffic for the experts under ep: this rank's num_experts / ep experts (``gathered`` bytes,
    ``reduced`` parameters), sharded over the efsdp = dp_shard / ep ranks that hold them (ranks ep apart)."""
    if plan.ep == 1:
        return 0.0
    return _fsdp2_seconds(plan, cluster, micro_batches, gathered, reduced, plan.dp_shard // plan.ep, plan.ep)


def estimate_time(stats: ModelStats, plan: Plan, cluster: Cluster, workload: Workload) -> TimeEstimate:
    """The predicted step time of ``plan`` on ``cluster`` for ``workload`` (module docstring); with a slow link
    between replica groups, what a semi-synchronous plan waits for its synchronisations (``replica_sync_time``) and
    what the link costs the step (``link_wait_s``: the step less the same plan's on the GPU table's links)."""
    estimate = _step_time(stats, *as_rows(plan, workload), cluster)  # a preference pair: two rows
    # what the records add to a step's compute (a reference model's forward, or its precomputed pass's share)
    compute_s = estimate.compute_s
    for term in RECORD_TIME_TERMS:
        estimate = longer_by(estimate, term(stats, plan, cluster, workload, compute_s), compute=True)
    # a vision-language model's images through the tower and the projector, at the language model's achieved rate;
    # every rank of a tp group runs the whole tower on the group's images (tp slices the language model only)
    if stats.vision is not None:
        lm_flops = model_flops_per_token(stats, workload.seq_len, workload) * workload.tokens
        vision_s = estimate.compute_s * stats.vision.step_flops(plan, workload) / lm_flops * plan.tp
        estimate = longer_by(estimate, vision_s, True)
    # a semi-synchronous plan's wait for its synchronisations: communication it does not hide
    wait = outer_wait_per_step(stats, plan, cluster, workload, estimate.step_s)
    estimate = longer_by(estimate, wait, compute=False)
    if cluster.replica_link is None:
        return estimate
    fast = estimate_time(stats, plan, replace(cluster, replica_link=None), workload)
    return replace(estimate, link_wait_s=max(0.0, estimate.step_s - fast.step_s))


RECORD_TIME_TERMS = tuple(c.time for c in CAPABILITIES if c.time is not None)


def longer_by(estimate: TimeEstimate, seconds: float, compute: bool = True) -> TimeEstimate:
    """``estimate`` with ``seconds`` more per step, of compute or of communication (throughput and MFU scaled)."""
    if not seconds:
        return estimate
    step = estimate.step_s + seconds
    return replace(
        estimate,
        step_s=step,
        tokens_per_s_per_device=estimate.tokens_per_s_per_device * estimate.step_s / step,
        mfu=estimate.mfu * estimate.step_s / step,
        compute_s=estimate.compute_s + seconds * compute,
        comm_s=estimate.comm_s + seconds * (not compute),
    )


def matmul_rate(cluster: Cluster, mixed_precision: str, tokens: int) -> tuple[float, bool]:
    """(FLOP/s, measured) the matmuls achieve at ``tokens`` rows: a probed profile's rate at the nearest shape, else
    the datasheet peak at ACHIEVABLE, the small-micro-batch saturation and the fp32 slowdown."""
    measured = measured_rate(cluster.gpu, mixed_precision, tokens)
    if measured is None and mixed_precision == "fp16":
        measured = measured_rate(cluster.gpu, "bf16", tokens)  # same tensor-core path (CPUs have no fp16)
    if measured is not None:  # a probed profile: the rate this machine achieved at the nearest shape
        return measured * 1e12, True
    saturation = tokens / (tokens + HALF_EFFICIENCY_TOKENS)
    slowdown = FP32_SLOWDOWN if mixed_precision == "fp32" else 1.0
    return cluster.gpu.peak_tflops * 1e12 * ACHIEVABLE * saturation / slowdown, False


def _step_time(stats: ModelStats, plan: Plan, workload: Workload, cluster: Cluster) -> TimeEstimate:
    """One step's compute and the communication it does not hide."""
    seq_len, mixed_precision, a = workload.seq_len, workload.mixed_precision, workload.dtype_bytes
    world = plan.world_size
    micro_batches = plan.grad_accum_steps(workload.global_batch_size)
    tokens = workload.tokens
    per_token = model_flops_per_token(stats, seq_len, workload)
    extra = 0.0
    if plan.activation_checkpointing == "full":  # one more forward of the checkpointed blocks (2N per token each)
        extra = recomputed_share(stats, plan) * stats.layers * stats.block_forward_flops(seq_len)
    # selective recomputes only element-wise ops: no FLOPs to speak of, one more element-wise pass (memory_bound_bytes)
    if plan.loss_chunk_tokens:  # each chunk's logits are computed again in its backward
        extra += 2.0 * stats.vocab * stats.hidden
    micro_tokens = plan.micro_batch_size * seq_len // plan.cp  # what one rank's matmuls see
    saturation = micro_tokens / (micro_tokens + HALF_EFFICIENCY_TOKENS)
    peak, probed = matmul_rate(cluster, mixed_precision, micro_tokens)
    compute = (per_token + extra) * tokens / world / peak
    compute -= fp8_seconds_saved(stats, cluster, workload, micro_tokens, saturation, peak) / world
    recomputed = recomputed_share(stats, plan) if plan.activation_checkpointing == "full" else 0.0
    compute += tp_matmul_seconds(stats, plan, cluster, workload, micro_tokens, recomputed) * tokens / world / peak
    if probed and cluster.gpu.copy_gbps > 0:
        # tokens per rank: the dp ranks split the batch and the cp ranks each row; tp ranks see the same tokens, pp
        # stages each see all of them
        rank_tokens = tokens / plan.dp / plan.cp
        trained = trained_params(stats, workload) / plan.tp if workload.adapters else None
        moved = memory_bound_bytes(stats, plan, rank_tokens, a, trained, compiled=workload.compile)
        moved += fp8_cast_bytes(stats, plan, rank_tokens, a, workload)
        compute += moved / (cluster.gpu.copy_gbps * 1e9)
    bandwidth = cluster.gpu.copy_gbps or cluster.gpu.memory_gbps * MEMORY_ACHIEVABLE
    compute += micro_batches * dequant_bytes(stats, plan, workload) / (bandwidth * 1e9)
    if plan.activation_checkpointing == "selective" and not (probed and cluster.gpu.copy_gbps > 0):
        # without a probed profile the element-wise work is inside the FLOP rate's efficiency, but selective
        # checkpointing's recompute is all element-wise: one more forward pass of it, at the memory bandwidth
        redo = recomputed_share(stats, plan) * stage_layers(stats, plan.pp) * elementwise_forward_bytes(stats, plan, a)
        compute += redo * tokens / plan.dp / plan.cp / (bandwidth * 1e9)
    # the floor: every micro-step launches each block's operators, whatever their size
    layers = stage_layers(stats, plan.pp)
    ops = OPS_PER_BLOCK * (COMPILED_ELEMENTWISE_SHARE if workload.compile else 1.0)
    compute += micro_batches * layers * ops * cluster.gpu.op_overhead_s
    compute = tp_time.with_machinery(compute, plan, cluster.gpu, layers, micro_batches, recomputed)
    if plan.pp > 1:
        # pipeline bubble: p - 1 idle slots of one stage's micro-batch time; the looped schedules run v stages of
        # 1/v the layers per rank, so their slots are v times shorter (Narayanan et al. 2021, sec. 2.2)
        chunks = micro_batches * plan.pp_virtual_stages
        compute *= (chunks + plan.pp - 1) / chunks

    blocks, root = stage_params(stats, plan)
    psi = blocks + root
    # what is gathered (parameters, in bytes per compute-dtype value) and what is reduced (gradients, parameters)
    gathered, reduced = a * psi, psi
    # under ep each expert is gathered and reduced over the efsdp ranks that hold it, apart (expert_fsdp_seconds)
    experts = stage_layers(stats, plan.pp) * stats.expert_params // plan.tp if plan.ep > 1 else 0
    gathered, reduced = gathered - a * experts, reduced - experts
    if workload.adapters:
        base_blocks, base_root = base_bytes(stats, plan, workload)
        gathered, reduced = base_blocks + base_root, trained_params(stats, workload) / plan.tp
    dp_overlapped = _data_parallel_seconds(stats, plan, cluster, workload, micro_batches, psi, gathered, reduced)
    dp_overlapped += _expert_fsdp_seconds(plan, cluster, micro_batches, a * experts / plan.ep, experts / plan.ep)
    if cluster.gpu.overlaps_comm:
        exposed = max(0.0, dp_overlapped - compute) + EXPOSED_FRACTION * min(dp_overlapped, compute)
    else:
        exposed = dp_overlapped

    tp_bw, act = link_bandwidth(cluster, plan.tp, 1), plan.micro_batch_size * seq_len * stats.hidden * a
    tp_comm = tp_time.collective_seconds(plan, cluster.gpu, tp_bw, act, layers, micro_batches, recomputed)
    pp_comm = _pipeline_seconds(plan, cluster, micro_batches, act)
    offload = _offload_seconds(stats, plan, cluster, workload, micro_batches, (psi, gathered, reduced))
    cp_comm = cp_all_to_all_seconds(stats, plan, cluster, seq_len, a, micro_batches)
    cp_comm += ep_all_to_all_seconds(stats, plan, cluster, seq_len, a, micro_batches)
    offload += activation_offload_seconds(stats, plan, cluster, seq_len, a, micro_batches, compute)
    comm = exposed + tp_comm + pp_comm + offload + cp_comm
    step = compute + comm
    model_flops = per_token * tokens
    mfu = model_flops / (step * world * cluster.gpu.peak_tflops * 1e12)
    return TimeEstimate(step, tokens / step / world, mfu, compute, comm)
