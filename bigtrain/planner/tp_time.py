"""What tensor parallelism adds to a step's time, beyond dividing the blocks' FLOPs by tp (``cost.estimate_time``).

Four terms, each from something measured:
- **smaller matmuls**: tp cuts every projection into slices (column-wise k -> n/tp, row-wise k/tp -> n) that run
  below the whole product's rate: on an H100, Llama-3-8B's k/v projection at 8k tokens ran at 456 TFLOP/s whole and
  299 at tp=4 (``bench/results/h100_probe.json``, ``projections``). With a profile that measured those shapes the
  projections' time is scaled by their measured slowdown (``projection_slowdown``): forward (m, k, n), input
  gradient (m, n, k) and weight gradient (k, m, n) products each at the rate of the nearest measured shape (log
  distance over m, k, n). Without one, 1.
- **the replicated LM head**: without loss parallelism the trainer keeps the head whole on every tp rank
  (``parallel/transforms/tensor_parallel.py``), so its matmul is repeated tp times, not split
  (``replicated_head_flops``). (The element-wise work that tp does not split is counted in
  ``cost.memory_bound_bytes``.)
- **the collectives**: per block and pass (forward, backward, the recompute of full checkpointing) two all-reduces
  of the micro-batch's b·L·h activations (Megatron-LM), or under sequence parallelism two all-gathers and two
  reduce-scatters of the same volume, each paying the link's latency (``GPU.link_latency_s``, fitted by
  ``bigtrain probe --nproc N``) beside its bytes over the bandwidth; not overlapped with compute
  (``collective_seconds``).
- **the DTensor machinery**: dispatching, wrapping and unwrapping every operator of a tp block, measured per block
  and micro-step by ``bigtrain probe`` (``probe_tp.py``); a recompute adds a forward, a third of it. Without a
  profile, TP_BLOCK_OVERHEAD_S (``machinery_seconds``). It is host time: on a CPU it adds to the step; a GPU's
  host runs ahead of its kernels, so there it shows only where it exceeds the step's compute (tiny models), which
  is also why the H200's tp runs needed none of it to be explained (``with_machinery``).
"""

from __future__ import annotations

import math

from bigtrain.config.plan import Plan
from bigtrain.planner.hardware import GPU, ring_share
from bigtrain.planner.model_stats import ModelStats

# Seconds per block and micro-step of tp's DTensor machinery when no probe measured it: an assumption, a third of the
# 6-7 ms the 2-core CPU this was built on measured (GPU hosts' cores are faster); bigtrain probe measures it.
TP_BLOCK_OVERHEAD_S = 2.0e-3


def projection_shapes(stats: ModelStats, tp: int) -> list[tuple[int, int]]:
    """(k, n) of one block's projections on one tp rank: q, k, v, gate, up column-wise (their outputs split), o and
    down row-wise (their inputs split)."""
    h, q, kv, f = stats.hidden, stats.q_width, stats.kv_width, stats.ffn
    column = [(h, q // tp), (h, kv // tp), (h, kv // tp), (h, f // tp)] + ([(h, f // tp)] if stats.gated_mlp else [])
    return column + [(q // tp, h), (f // tp, h)]


def _rate(gpu: GPU, m: int, k: int, n: int) -> float:
    """TFLOP/s of the measured projection nearest (m, k, n) on a log scale."""
    row = min(
        gpu.projection_tflops,
        key=lambda r: math.log(r[0] / m) ** 2 + math.log(r[1] / max(k, 1)) ** 2 + math.log(r[2] / max(n, 1)) ** 2,
    )
    return row[3]


def projection_seconds(stats: ModelStats, gpu: GPU, tp: int, tokens: int) -> float:
    """Seconds of one block's projection products on one tp rank for ``tokens`` rows, forward and both gradients,
    at the profile's measured rates (``gpu.projection_tflops`` must not be empty)."""
    total = 0.0
    for k, n in projection_shapes(stats, tp):
        flops = 2.0 * tokens * k * n
        total += flops / _rate(gpu, tokens, k, n) + flops / _rate(gpu, tokens, n, k) + flops / _rate(gpu, k, tokens, n)
    return total / 1e12


def projection_slowdown(stats: ModelStats, gpu: GPU, tp: int, tokens: int) -> float:
    """How much longer a block's projections take cut into tp slices than 1/tp of the whole ones, per the profile's
    measured rates; 1 without measured projections or tp."""
    if tp == 1 or not gpu.projection_tflops:
        return 1.0
    return tp * projection_seconds(stats, gpu, tp, tokens) / projection_seconds(stats, gpu, 1, tokens)


def projection_flops_per_token(stats: ModelStats) -> float:
    """Forward FLOPs per token of one block's projections (its matmul weights, attention scores excluded)."""
    return stats.block_forward_flops(1) - stats.attention_forward_flops(1)


def replicated_head_flops(stats: ModelStats, plan: Plan, head_flops_per_token: float) -> float:
    """FLOPs per token the tp ranks repeat beyond their 1/tp share: the whole LM head on each of them, unless loss
    parallelism splits it over the vocabulary."""
    if plan.tp == 1 or plan.loss_parallel:
        return 0.0
    return head_flops_per_token * (plan.tp - 1)


def collective_seconds(
    plan: Plan, gpu: GPU, bandwidth: float, act_bytes: float, layers: int, micro_batches: int, recomputed: float
) -> float:
    """Seconds of tp's collectives in one step: per block and pass two all-reduces of ``act_bytes`` (or two
    all-gathers and two reduce-scatters under sequence parallelism), latency plus ring volume over ``bandwidth``
    (bytes/s); ``recomputed``: the share of blocks whose forward runs again (full checkpointing)."""
    if plan.tp == 1:
        return 0.0
    ring = ring_share(plan.tp)
    passes = 2.0 + recomputed
    calls, volume = (4, ring * act_bytes) if plan.sequence_parallel else (2, 2 * ring * act_bytes)
    return layers * micro_batches * passes * calls * (gpu.link_latency_s + volume / bandwidth)


def machinery_seconds(plan: Plan, gpu: GPU, layers: int, micro_batches: int, recomputed: float) -> float:
    """Seconds of the DTensor machinery of tp's blocks in one step (module docstring)."""
    if plan.tp == 1:
        return 0.0
    measured = gpu.tp_block_overhead_s
    per_block = (measured[1] if plan.sequence_parallel else measured[0]) if measured else TP_BLOCK_OVERHEAD_S
    return layers * micro_batches * (1.0 + recomputed / 3) * per_block


def with_machinery(compute: float, plan: Plan, gpu: GPU, layers: int, micro_batches: int, recomputed: float) -> float:
    """The step's compute seconds with tp's machinery: added on a CPU (it runs on the cores that compute), the
    larger of the two on a GPU (the host dispatches ahead of the kernels)."""
    machinery = machinery_seconds(plan, gpu, layers, micro_batches, recomputed)
    return max(compute, machinery) if gpu.overlaps_comm else compute + machinery
