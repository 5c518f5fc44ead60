"""Predicted time of the rollout that precedes each training step of online RL (``Workload.generation``, grpo).

Each data-parallel rank generates its R = global batch / dp completions at once on the policy's engine
(transformers' ``generate``, a KV cache, ``measure/generation_step.py`` has its memory):
- the prefill: R·P prompt tokens through every block, compute-bound: 2 FLOPs per parameter and token plus attention
  over the prompt, at the rate the matmuls achieve at R·P rows;
- C - 1 decode steps of R tokens each (the completions are taken to run to the limit: an upper bound where they all
  end early), each the longest of its compute (at R rows: the rate of a small matmul), reading the weights and the
  KV cache once (at the memory bandwidth; the cache's mean size over the steps; transformers' cache also copies
  itself once per step as it grows), and what a sharded model gathers:
  FSDP2's ZeRO-3 mode and DeepSpeed ZeRO-3 all-gather every unit for every forward, so every generated token moves
  the model's compute-dtype bytes over the data-parallel link (ZeRO-2 mode keeps them gathered after the first
  forward; DDP and ZeRO-1/2 hold them whole); with several ranks, each step's vote on whether all are done (a
  small all-reduce: the link's delay);
- the host's share of every forward of the loop, whatever the model's size: a fixed part (sampling, stopping, the
  cache's bookkeeping) and one per block (its modules' Python and launches), measured by ``bigtrain probe``
  (``decode_step_s``; without a profile, the per-operator floor times DECODE_OPS);
- with train.num_iterations (mu) > 1, one forward of the batch for the generating policy's log-probabilities, a
  third of the training step's matmuls.
A generation serves mu steps: each step carries 1/mu of it. The reward functions' time is the user's (not modelled).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, replace
from typing import Any

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.cost import MEMORY_ACHIEVABLE, TimeEstimate, estimate_time, longer_by, matmul_rate
from bigtrain.planner.hardware import Cluster, link_bandwidth, link_delay, ring_share
from bigtrain.planner.memory_terms import stage_params
from bigtrain.planner.model_stats import ModelStats
from bigtrain.planner.rollout_memory import EVERY_FORWARD, NEVER, kv_cache_bytes, reward_model_share, rollout_gathers

# without a probed profile: operators one block launches per decode step (norms, projections, RoPE, attention,
# the cache's update) and the loop's own per step (logits processors, sampling, stopping, masks, positions)
DECODE_OPS_PER_BLOCK, DECODE_OPS_FIXED = 40, 150
FORWARD_SHARE = 1.0 / 3.0  # a forward's share of a training step's matmuls (the old log-probabilities' pass)


@dataclass(frozen=True)
class RolloutTime:
    """Seconds of one generation's phases on one rank."""

    prefill_s: float
    decode_s: float
    logps_s: float

    @property
    def generate_s(self) -> float:
        return self.prefill_s + self.decode_s


def host_seconds_per_forward(stats: ModelStats, cluster: Cluster) -> float:
    """What one forward of the loop costs the host: the probe's measured split, else the operator floor."""
    measured = cluster.gpu.decode_step_s
    if measured is not None:
        return measured[0] + measured[1] * stats.layers
    return (DECODE_OPS_FIXED + DECODE_OPS_PER_BLOCK * stats.layers) * cluster.gpu.op_overhead_s


def _gather_seconds(stats: ModelStats, plan: Plan, cluster: Cluster, workload: Workload) -> float:
    """One forward's all-gathers of a sharded model's units: the compute-dtype parameters over the shards' link,
    and each unit's message delay."""
    shards = plan.dp_shard if plan.backend == "fsdp2" else plan.dp
    if shards == 1 or rollout_gathers(plan) == NEVER:
        return 0.0
    blocks, root = stage_params(stats, plan)
    moved = ring_share(shards) * workload.dtype_bytes * (blocks + root)
    return moved / link_bandwidth(cluster, shards, 1) + (stats.layers + 1) * link_delay(cluster, shards, 1)


def rollout_time(
    stats: ModelStats, plan: Plan, cluster: Cluster, workload: Workload, step_compute_s: float
) -> RolloutTime:
    """One generation's phases on one rank (module docstring); ``step_compute_s``: the training step's compute."""
    g = workload.generation
    assert g is not None
    rows, a = g.rows(workload.global_batch_size, plan.dp), workload.dtype_bytes
    host = host_seconds_per_forward(stats, cluster)
    gather = _gather_seconds(stats, plan, cluster, workload)
    prompt_tokens = rows * g.prompt_len
    prefill_flops = prompt_tokens * stats.layers * stats.block_forward_flops(g.prompt_len)
    prefill = prefill_flops / matmul_rate(cluster, workload.mixed_precision, prompt_tokens)[0] + host + gather
    steps = max(g.completion_len - 1, 0)
    mean_positions = g.prompt_len + g.completion_len / 2
    # a decode token attends to every cached position (4 FLOPs per position and query width: block_forward_flops'
    # count, whose causal row of L tokens is counted as L positions each)
    flops = rows * (stats.layers * stats.block_forward_flops(int(mean_positions)) + 2 * stats.vocab * stats.hidden)
    compute = flops / matmul_rate(cluster, workload.mixed_precision, rows)[0]
    bandwidth = (cluster.gpu.copy_gbps or cluster.gpu.memory_gbps * MEMORY_ACHIEVABLE) * 1e9
    cache = kv_cache_bytes(stats, workload, rows, int(mean_positions))
    read = a * stats.params + cache
    per_gather = gather if rollout_gathers(plan) == EVERY_FORWARD else 0.0  # ZeRO-2 mode: the prefill's only
    # transformers' DynamicCache grows by concatenation: each step copies the whole cache once more (read and
    # write); every rank then votes whether all are done (synced_gpus: one small all-reduce per step)
    grow = 2 * cache / bandwidth
    vote = link_delay(cluster, plan.dp, 1) if plan.dp > 1 else 0.0
    decode = steps * (max(compute, read / bandwidth, per_gather) + grow + host + vote)
    logps = FORWARD_SHARE * step_compute_s if g.num_iterations > 1 else 0.0
    return RolloutTime(prefill, decode, logps)


def estimate_step_time(stats: ModelStats, plan: Plan, cluster: Cluster, workload: Workload) -> TimeEstimate:
    """A causal LM's step time (``cost.estimate_time``) with what its rollouts add: a generation's phases over the mu
    steps that train on it, as compute (the phases' seconds kept in ``phases``, per generation)."""
    estimate = estimate_time(stats, plan, cluster, workload)
    g = workload.generation
    if g is None:
        return estimate
    t = rollout_time(stats, plan, cluster, workload, estimate.compute_s)
    phases = (("prefill", t.prefill_s), ("decode", t.decode_s), ("logps", t.logps_s), ("train", estimate.step_s))
    longer = longer_by(estimate, (t.generate_s + t.logps_s) / g.num_iterations)
    return replace(longer, phases=phases)


def rollout_note(choice: Any, workload: Workload) -> list[str]:
    """The plan table's lines on a chosen plan's two phases: each phase's seconds per generation, how each step
    carries it, and each phase's peak memory."""
    g = workload.generation
    if g is None or not choice.time.phases:
        return []
    t, m = dict(choice.time.phases), dict(choice.memory.phases)
    rows = g.rows(workload.global_batch_size, choice.plan.dp)
    shared = f", shared by the {g.num_iterations} steps that train on it" if g.num_iterations > 1 else ""
    logps = f", old log-probabilities {t['logps']:.2f} s" if t["logps"] else ""
    peak = "generation" if m["generation"] >= m["training"] else "training"
    gathers = " (every token gathers the sharded model)" if rollout_gathers(choice.plan) == EVERY_FORWARD else ""
    text = (
        f"rollouts: {rows} completions per rank generated at once with transformers' generate on the policy: "
        f"prefill {t['prefill']:.2f} s, decode {t['decode']:.2f} s ({g.completion_len} tokens, taken to the "
        f"limit){gathers}{logps} per generation{shared}; training {t['train']:.2f} s per step; reward functions "
        f"not timed; peak: generation {m['generation'] / 2**30:.1f} GiB, training {m['training'] / 2**30:.1f} GiB "
        f"(the {peak} phase's is the step's"
        + (
            f"; reward models {reward_model_share(choice.plan, g.resident_bytes) / 2**30:.2f} GiB per rank in both)"
            if g.resident_bytes
            else ")"
        )
    )
    return textwrap.wrap(text, 118, initial_indent="  ", subsequent_indent="    ")
