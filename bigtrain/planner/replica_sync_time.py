"""What a slow link between replica groups costs a step, synchronised every step or every H steps (``parallel.sync``).

Every step (data parallelism as always): the gradients cross the link each step. Its bandwidth is shared by all GPUs
of a group (``ReplicaLink.per_gpu``) and each collective that crosses it waits for its latency once per ring step:
2 (n - 1) latencies per all-reduce of n groups, (n - 1) per all-gather or reduce-scatter (``link_latency_seconds``;
FSDP2 runs one collective per unit and pass, about one per decoder block; DDP one per 25 MiB bucket).

A pipeline whose stages sit on both sides pays the hop between them for every micro-batch's activation and gradient,
the boundary stage's ranks sharing the link (``pipeline_hop_seconds``).

Every H steps (local SGD, DiLoCo): nothing crosses the link between synchronisations. One synchronisation moves each
rank's share of the trained parameters once around the ring of the R groups in the sync dtype (an all-reduce:
2 (R - 1) / R of it per rank), pays 2 (R - 1) latencies per fragment, and with the outer state on the host copies
its shard in and out over PCIe (fp32). Split into F fragments, each fragment's transfer overlaps the next tau
(``fragment_delay``) inner steps; what it does not hide is waited for. Averaged over the H steps of a period:
F max(0, T / F - tau t_step) / H.

``WAIT_SHARE``: a semi-synchronous plan is chosen only when the best every-step plan waits on the link for more than
this share of its step (``search._rank``); below it, synchronous training is kept: same speed within a few percent,
and no question about the final model's quality.
"""

from __future__ import annotations

import math

from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.adapter_memory import trained_params
from bigtrain.planner.hardware import Cluster, link_bandwidth, link_delay, ring_share
from bigtrain.planner.memory_terms import stage_params, state_shards
from bigtrain.planner.model_stats import ModelStats

WAIT_SHARE = 0.20
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb


def replica_stride(plan: Plan) -> int:
    """Ranks between two replica groups' ranks at the same place (the mesh is pp x dp_replicate x dp_shard x cp x
    tp, row-major)."""
    return plan.dp_shard * plan.cp * plan.tp


def rank_trained_params(stats: ModelStats, plan: Plan, workload: Workload) -> float:
    """The trained parameters one rank holds (its shard): what its outer state keeps and its sync moves."""
    if workload.adapters:
        return trained_params(stats, workload) / plan.tp / plan.pp
    blocks, root = stage_params(stats, plan)
    return (blocks + root) / state_shards(plan)


def outer_sync_seconds(stats: ModelStats, plan: Plan, cluster: Cluster, workload: Workload) -> float:
    """One synchronisation of every fragment: the all-reduce of the pseudo-gradients across the replica groups, its
    latencies, and the host copies of the outer state."""
    sync = settings_of(plan)
    groups, stride = plan.dp_replicate, replica_stride(plan)
    local = rank_trained_params(stats, plan, workload)
    dtype_bytes = 2 if sync.dtype == "bf16" else 4
    bandwidth = link_bandwidth(cluster, groups, stride)
    seconds = 2 * ring_share(groups) * local * dtype_bytes / bandwidth
    seconds += sync.fragments * 2 * (groups - 1) * link_delay(cluster, groups, stride)
    if sync.outer_state == "host":  # the synchronised weights in, the new ones out, fp32
        seconds += 2 * 4 * local / (cluster.gpu.pcie_gbps * 1e9)
    return seconds


def outer_wait_per_step(
    stats: ModelStats, plan: Plan, cluster: Cluster, workload: Workload, inner_step_s: float
) -> float:
    """The seconds per step a semi-synchronous plan waits for its synchronisations (0 when it syncs every step)."""
    sync = settings_of(plan)
    if not sync.semi_synchronous:
        return 0.0
    per_fragment = outer_sync_seconds(stats, plan, cluster, workload) / sync.fragments
    hidden = sync.delay * inner_step_s
    return sync.fragments * max(0.0, per_fragment - hidden) / sync.every


def link_latency_seconds(
    stats: ModelStats, plan: Plan, cluster: Cluster, micro_batches: int, reduced_bytes: float
) -> float:
    """Latency of an every-step plan's data-parallel collectives that cross the slow link, per step (0 without one
    or when none crosses it). ``reduced_bytes``: the fp32 gradients one rank reduces."""
    if cluster.replica_link is None or settings_of(plan).semi_synchronous:
        return 0.0
    crossings = {"ddp": _ddp_crossings, "fsdp2": _fsdp2_crossings, "deepspeed": _zero_crossings}[plan.backend]
    units = stats.layers + 1  # FSDP2 and ZeRO-3: about one collective per block and pass, and the root's
    return crossings(plan, cluster, micro_batches, reduced_bytes, units) * cluster.replica_link.latency_s


def _ddp_crossings(plan: Plan, cluster: Cluster, micro_batches: int, reduced_bytes: float, units: int) -> float:
    """Ring steps over the link per step: one all-reduce per 25 MiB bucket over every rank that sees other tokens."""
    ranks = plan.dp * plan.cp
    if not cluster.spans_link(ranks, plan.tp):
        return 0.0
    return math.ceil(reduced_bytes / DDP_BUCKET_BYTES) * 2 * (ranks - 1)


def _fsdp2_crossings(plan: Plan, cluster: Cluster, micro_batches: int, reduced_bytes: float, units: int) -> float:
    """Per unit: gathers and reduce-scatters where the shards reach over the link, HSDP's all-reduce where the
    replicas do."""
    steps = 0.0
    shards = state_shards(plan)
    if cluster.spans_link(shards, plan.tp):
        gathers = 2 if plan.zero_stage == 3 else 1
        reduces = micro_batches if plan.grad_reduce == "every_micro_step" else 1
        steps += units * (gathers * micro_batches + reduces) * (shards - 1)
    if cluster.spans_link(plan.dp_replicate, replica_stride(plan)):
        steps += units * 2 * (plan.dp_replicate - 1)
    return steps


def _zero_crossings(plan: Plan, cluster: Cluster, micro_batches: int, reduced_bytes: float, units: int) -> float:
    """DeepSpeed ZeRO over every data-parallel rank: about three ring passes per unit and step."""
    return units * 3 * (plan.dp - 1) if cluster.spans_link(plan.dp, plan.tp) else 0.0


def pipeline_hop_seconds(plan: Plan, cluster: Cluster, micro_batches: int, activation_bytes: float) -> float | None:
    """A pipeline's sends (one activation and one gradient per micro-batch and rank, ``activation_bytes`` each) where
    its stages sit in different groups of the slow link: the hop between them carries every rank of the boundary
    stage's sends at once, each with the link's delay. None where the pipeline stays inside a group."""
    link = cluster.replica_link
    if link is None or plan.pp == 1 or link.groups < 2:
        return None
    stage = cluster.num_gpus // plan.pp
    senders = min(stage, cluster.num_gpus // link.groups)  # the boundary stage's ranks on one side
    return 2 * micro_batches * (activation_bytes / plan.tp / (link.bytes_per_s / senders) + link.latency_s)
