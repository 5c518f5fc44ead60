"""Predicted peak memory of a pipelined plan (pp > 1): every pp rank estimated on its own, the largest returned.

The ranks of a pipeline differ: the first holds the embeddings and keeps the most micro-batches in flight, the
last holds the head and the loss, middle ranks receive activations and gradients from both sides, and a multi-stage
schedule gives one rank several stages. Per pp rank, with P its stages' parameters (per tp rank), S = dp_shard,
a = compute-dtype bytes, m = micro-batches per step, t = b·L tokens per micro-batch, h = hidden size:
- model states as FSDP2's (``data_parallel_memory.py``): 4P/S parameters, 8P/S AdamW states;
- during the micro-batches: the *unsharded* fp32 gradients 4P (torch's schedules turn gradient reduction off
  until the last micro-batch, which is ``grad_reduce: once_per_step``) and the stages' parameters in the compute
  dtype, aP: the schedules also stop FSDP2 from resharding after each backward, so from the first backward on a
  stage stays gathered;
- activations of the micro-batches in flight (below) times the blocks each holds, as for one device
  (``memory_terms.micro_batch_activations``), plus the stage's output a·h·t per micro-batch in flight on every stage but
  the last (kept by the schedule for its backward);
- the loss on the last stage: 12 bytes per logit of one micro-batch at its backward (``memory_terms.logits_bytes``);
- receive buffers, allocated at the first step for every micro-batch and kept: a·h·t per micro-batch for the
  activations of each stage that is not first and for the gradients of each stage that is not last;
- at the optimizer step the sharded gradients and the AdamW temporary (4P/S each) replace all the above but the
  buffers.
Micro-batches in flight (whose activations are alive at the peak) on rank r of p, with m micro-batches: GPipe runs
every forward before any backward, m; 1F1B min(p - r, m) (its warm-up); the looped schedules count stage-chunks
of layers/(p·v) layers each: interleaved 1F1B's warm-up is (v - 1)·p + 2(p - 1 - r) + 1 chunks (torch's
``Interleaved1F1B``), looped BFS runs all m micro-batches of a stage before the next, so m chunks of each of its v
stages.
Checked against the simulator running bigtrain's pipelined step (torch's schedules on a fake process group, every
pp rank): ``tests/cases.py`` MEMORY_CASES with pp.
"""

from __future__ import annotations

from bigtrain.config.pipeline import num_stages, stages_of_rank
from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.memory_terms import (
    MemoryEstimate,
    device_margin,
    micro_batch_activations,
)
from bigtrain.planner.model_stats import ModelStats


def stages_in_flight(plan: Plan, pp_rank: int, micro_batches: int) -> float:
    """Micro-batches whose activations rank ``pp_rank`` holds at its peak, in units of one of its stages."""
    p, m, v = plan.pp, micro_batches, plan.pp_virtual_stages
    if plan.pp_schedule == "gpipe":
        return m
    if plan.pp_schedule == "1f1b":
        return min(p - pp_rank, m)
    if plan.pp_schedule == "looped_bfs":
        return m * v
    # interleaved 1F1B and the other looped schedules: the warm-up of torch's Interleaved1F1B
    return min((v - 1) * p + 2 * (p - 1 - pp_rank) + 1, m * v)


def estimate_pipeline_rank(stats: ModelStats, plan: Plan, pp_rank: int, workload: Workload) -> MemoryEstimate:
    """The predicted peak of pp rank ``pp_rank`` and its parts at that moment."""
    seq_len, a = workload.seq_len, workload.dtype_bytes
    m = plan.grad_accum_steps(workload.global_batch_size)
    total = num_stages(plan)
    stages = stages_of_rank(pp_rank, plan)
    base, extra = divmod(stats.layers, total)  # as config.pipeline.stage_layer_ranges splits them
    layers = sum(base + (s < extra) for s in stages)
    first, last = 0 in stages, total - 1 in stages
    psi = layers * stats.block_params // plan.tp
    psi += stats.embed_params if first else 0
    psi += stats.head_params + stats.norm_params if last else 0
    shard = plan.dp_shard
    params, optim = 4 * psi // shard, 8 * psi // shard
    tokens = plan.micro_batch_size * seq_len
    one_act = a * stats.hidden * tokens  # one micro-batch's hidden state, as sent between stages

    # per micro-batch in flight on one stage (the rank's stages hold layers / len(stages) blocks each on average)
    kept, transient = micro_batch_activations(stats, plan, seq_len, a, layers / len(stages), has_loss=last)
    chunks = stages_in_flight(plan, pp_rank, m)
    per_stage = chunks / len(stages)  # micro-batches in flight per stage
    only_last = last and len(stages) == 1
    all_forwards_first = plan.pp_schedule in ("gpipe", "looped_bfs")
    last_in_flight = m if all_forwards_first else 1  # on the last stage
    per_chunk = kept + (0 if only_last else one_act)  # blocks, and the stage's output kept for its backward
    # what does not scale with the chunks in flight, at a backward's start and at its end
    embeddings_out = int(per_stage * one_act) if first else 0
    fixed_start = fixed_end = transient + embeddings_out  # the recomputed block (checkpointing) is alive in both
    if last:
        # per micro-batch in flight on the last stage: the final norm's saved tensors (as a block's norm), the logits
        # the schedule keeps for the stage's backward (a bytes each) and the fp32 log-softmax its loss saved (4);
        # the backward of one loss needs 12 bytes per logit in all (see memory_terms.py), and frees that micro-batch's
        per_micro_batch = (4 * stats.hidden + 2 * a * stats.hidden + 4) * tokens + (a + 4) * tokens * stats.vocab
        fixed_start += last_in_flight * per_micro_batch + 8 * tokens * stats.vocab
        fixed_end += (last_in_flight - 1) * per_micro_batch
    buffers = one_act * m * (sum(s != 0 for s in stages) + sum(s != total - 1 for s in stages))

    # Two moments of a backward: its start, with all micro-batches in flight alive, the earlier backwards' unsharded
    # gradients and, with ZeRO-3 (blocks resharded after each forward), the stage's root and one block gathered; its
    # end, one micro-batch fewer, every gradient and every parameter of the stage unsharded, and on the first stage
    # the embeddings' gradient in the compute dtype before it is accumulated. GPipe and looped BFS reach their first
    # backward with no gradients yet.
    root = psi - layers * stats.block_params // plan.tp
    gathered_start = a * psi if plan.zero_stage == 2 else a * (root + stats.block_params // plan.tp)
    grads_start = 0 if all_forwards_first or m == 1 else 4 * psi
    start = (grads_start, int(chunks * per_chunk) + fixed_start, gathered_start + buffers)
    end_extra = a * stats.embed_params if first else 0
    unsharded = psi
    if all_forwards_first and len(stages) > 1:
        # looped BFS ends its first backward on the rank's last stage: only that stage is unsharded
        unsharded, end_extra = psi // len(stages), 0
    end = (4 * unsharded, int((chunks - 1) * per_chunk) + fixed_end, a * unsharded + end_extra + buffers)
    at_step = (4 * psi // shard, 0, 4 * psi // shard + buffers)
    peak = max((start, end, at_step), key=sum)
    margin = device_margin(stats, plan, seq_len, params + optim + sum(peak))
    return MemoryEstimate(params, peak[0], optim, peak[1], peak[2], margin)


def estimate_pipeline_memory(stats: ModelStats, plan: Plan, workload: Workload) -> MemoryEstimate:
    """The busiest pp rank's estimate. Only three ranks can be it: the first (embeddings, most micro-batches in
    flight), the second (the most of both among the inner ranks: in-flight counts fall with the rank, and the first
    stages take the layers that do not divide evenly) and the last (head and loss)."""
    ranks = sorted({0, min(1, plan.pp - 1), plan.pp - 1})
    estimates = (estimate_pipeline_rank(stats, plan, r, workload) for r in ranks)
    return max(estimates, key=lambda e: e.total_bytes)
