"""Predicted peak tensor memory of one device for one plan: what ``torch.cuda.max_memory_allocated`` would show.

One estimate per kind of plan, each built from the shared terms of ``memory_terms.py``: FSDP2 and DDP
(``data_parallel_memory.py``), DeepSpeed ZeRO (``deepspeed_memory.py``, measured on DeepSpeed's own step),
pipelined plans (``pipeline_memory.py``, every pp rank) and adapter plans (``adapter_memory.py``). This module only
picks one; it is imported by none of them.
"""

from __future__ import annotations

from dataclasses import replace

from bigtrain.config.capabilities import CAPABILITIES
from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.adapter_memory import adapter_host_bytes, estimate_adapter_memory
from bigtrain.planner.data_parallel_memory import estimate_data_parallel_memory
from bigtrain.planner.deepspeed_memory import estimate_deepspeed_memory
from bigtrain.planner.memory_terms import MemoryEstimate, host_offload_bytes, offloaded_block_bytes, rank_seq_len
from bigtrain.planner.model_stats import ModelStats
from bigtrain.planner.pipeline_memory import estimate_pipeline_memory
from bigtrain.planner.preference import as_rows
from bigtrain.planner.rollout_memory import with_generation


def estimate_memory(stats: ModelStats, plan: Plan, workload: Workload) -> MemoryEstimate:
    """The predicted peak of ``plan`` for ``workload`` and its parts at the moment it happens (with what the
    capability records' own terms add, ``Capability.memory``, in ``other``)."""
    estimate = _estimate(stats, *as_rows(plan, workload))  # a preference pair: two rows
    resident = added = sum(term(stats, plan, workload) for term in RECORD_TERMS)
    if stats.vision is not None:  # what a vision-language model's images keep for backward (vision_stats.py)
        added += stats.vision.activation_bytes(plan, workload)
    estimate = replace(estimate, other_bytes=estimate.other_bytes + added) if added else estimate
    # online RL: the rollout before the training phase, with what the records keep resident (rollout_memory.py)
    return with_generation(stats, plan, workload, estimate, resident)


RECORD_TERMS = tuple(c.memory for c in CAPABILITIES if c.memory is not None)
RECORD_HOST_TERMS = tuple(c.host for c in CAPABILITIES if c.host is not None)


def _estimate(stats: ModelStats, plan: Plan, workload: Workload) -> MemoryEstimate:
    if workload.adapters:
        return estimate_adapter_memory(stats, plan, workload)
    if plan.backend == "deepspeed":
        return estimate_deepspeed_memory(stats, plan, workload)
    if plan.pp > 1:
        return estimate_pipeline_memory(stats, plan, workload)
    return estimate_data_parallel_memory(stats, plan, workload)


def host_bytes(stats: ModelStats, plan: Plan, workload: Workload) -> int:
    """Host memory per GPU that a plan's offloads keep: parameters and optimizer states (adapter plans: the base
    shard and the adapters' states), and the saved activations of one micro-batch (``offload_activations``)."""
    states = adapter_host_bytes(stats, plan, workload) if workload.adapters else host_offload_bytes(stats, plan)
    states += sum(term(stats, plan, workload) for term in RECORD_HOST_TERMS)
    plan, workload = as_rows(plan, workload)
    seq_len = rank_seq_len(plan, workload.seq_len)
    return states + offloaded_block_bytes(stats, plan, seq_len, workload.dtype_bytes, stats.layers)
