"""Predicted peak of the rollout that precedes each training step of online RL (``Workload.generation``, grpo).

Generation runs on the policy's own engine (``Engine.generate``): every data-parallel rank generates its R = global
batch / dp completions at once with transformers' ``generate`` and a KV cache, in eval mode without a graph. What
the training step leaves on the device is there: the parameters and optimizer states (``MemoryEstimate`` of the
training phase), DDP's gradient buckets (allocated up front), a sharded reference's copy; FSDP2's sharded gradients
are gone (the optimizer sets them to None). On top, the largest of three moments (seen on the simulated rollout,
``measure/generation_step.py``, at Llama-3.2-1B, Llama-3-8B and Qwen2.5-7B widths):
- gathering the first units (FSDP2, DeepSpeed ZeRO-3): the root unit's all-gather output and its unsharded copy,
  and a block with the next one prefetched: a·(2·root + 2·block);
- the prefill: the KV cache of the prompts (R·P tokens, 2·kv_width values per layer and token in the compute
  dtype), and one block's transients over R·P tokens: the MLP's three ffn-wide tensors and four hidden-wide ones
  (a·(3·ffn + 4·h) per token), the 4-D boolean attention mask (P bytes per token) and the 2-D one (8); the root and
  two blocks gathered (ZeRO-2 mode: every block);
- the last decode step: the KV cache at P + C positions, one layer's key (or value) copied as the cache grows by a
  token, and the last position's logits as the sampling loop treats them (the compute-dtype logits, their fp32
  copy, the log-probabilities ``SampledLogps`` keeps, the probabilities: a + 12 bytes per row and vocabulary entry).
DDP also keeps autocast's compute-dtype copy of every fp32 weight for the whole ``generate`` call (one autocast
region: its cast cache lives until it exits). Reward-model folders are on the device for the run, in the dtype they
were saved in (``Generation.resident_bytes``, read from their safetensors headers), laid out as the policy (FSDP2:
sharded; DeepSpeed ZeRO-3: partitioned; whole otherwise): in both phases (the unit a sharded one gathers to score is
not counted).
"""

from __future__ import annotations

import dataclasses

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.adapter_memory import NF4_BYTES
from bigtrain.planner.memory_terms import MemoryEstimate, device_margin, frozen_params, stage_params
from bigtrain.planner.model_stats import ModelStats

SAMPLING_FP32_COPIES = 3  # the logits' fp32 copy, SampledLogps' log-probabilities, softmax's probabilities


def kv_cache_bytes(stats: ModelStats, workload: Workload, rows: int, positions: int) -> int:
    """Keys and values of every layer for ``rows`` rows of ``positions`` tokens, in the compute dtype."""
    return rows * positions * stats.layers * 2 * stats.kv_width * workload.dtype_bytes


def prefill_bytes(stats: ModelStats, workload: Workload, rows: int) -> int:
    """One block's transients over the prefill's tokens, and the attention masks (module docstring)."""
    g = workload.generation
    assert g is not None
    a, tokens = workload.dtype_bytes, rows * g.prompt_len
    mlp = (3 if stats.gated_mlp else 2) * stats.ffn
    return tokens * (a * (mlp + 4 * stats.hidden) + g.prompt_len + 8)


def decode_bytes(stats: ModelStats, workload: Workload, rows: int) -> int:
    """The last decode step's transients: a layer's key copy as the cache grows, and the sampled logits."""
    g = workload.generation
    assert g is not None
    a = workload.dtype_bytes
    layer_copy = rows * (g.prompt_len + g.completion_len) * stats.kv_width * a
    return layer_copy + rows * stats.vocab * (a + 4 * SAMPLING_FP32_COPIES)


EVERY_FORWARD, ONCE, NEVER = "every forward", "once", "never"


def rollout_gathers(plan: Plan) -> str:
    """How often generation gathers a sharded model's units: for every forward of the loop (FSDP2's ZeRO-3 mode,
    DeepSpeed ZeRO-3), once (FSDP2's ZeRO-2 mode: reshard_after_forward=False keeps them gathered), or never (the
    model whole on each rank: DDP, ZeRO-1/2)."""
    if plan.backend == "fsdp2":
        return ONCE if plan.zero_stage == 2 else EVERY_FORWARD
    return EVERY_FORWARD if plan.zero_stage == 3 else NEVER


def _gathered(stats: ModelStats, plan: Plan, workload: Workload) -> tuple[float, float, float]:
    """(at the first units' gathering, during the prefill and decode, every block gathered under ZeRO-2 mode): the
    compute-dtype parameters generation gathers beyond the resident ones."""
    a = workload.dtype_bytes
    blocks, root = stage_params(stats, plan)
    block = blocks / stats.layers
    if workload.method == "qlora":  # NF4 blocks stay 4-bit when gathered
        block = block * NF4_BYTES / a
    gathers = rollout_gathers(plan)
    if gathers == NEVER:
        return 0.0, 0.0, 0.0
    start, running = a * (2 * root + 2 * block), a * (root + 2 * block)
    if gathers == ONCE:  # every block stays gathered by the last decode step
        return start, running, a * (root + blocks + block)
    return start, running, running


def _resident_extras(stats: ModelStats, plan: Plan, workload: Workload) -> tuple[int, int]:
    """(gradients, other): what DDP keeps beside the model states during generation: its gradient buckets, and
    autocast's compute-dtype copies of the fp32 weights."""
    if plan.backend != "ddp":
        return 0, 0
    blocks, root = stage_params(stats, plan)
    if workload.adapters:
        return 0, 0  # a frozen base in the compute dtype: nothing to cast, adapters' buckets negligible
    trained = blocks + root - frozen_params(stats, workload)
    casts = workload.dtype_bytes * (blocks + root) if workload.dtype_bytes != 4 else 0
    return 4 * trained, casts


def estimate_generation_memory(
    stats: ModelStats, plan: Plan, workload: Workload, training: MemoryEstimate, resident: int
) -> MemoryEstimate:
    """The rollout's peak on one device and its parts at that moment (``activations``: the KV cache and the
    moment's transients; ``other``: gathered parameters, DDP's casts and ``resident``, what the capability records
    keep on the device for the run, such as a sharded reference)."""
    g = workload.generation
    assert g is not None
    rows = g.rows(workload.global_batch_size, plan.dp)
    start, running, decoding = _gathered(stats, plan, workload)
    prefill = kv_cache_bytes(stats, workload, rows, g.prompt_len) + prefill_bytes(stats, workload, rows)
    last = kv_cache_bytes(stats, workload, rows, g.prompt_len + g.completion_len) + decode_bytes(stats, workload, rows)
    grads, casts = _resident_extras(stats, plan, workload)
    moments = [(0, start), (prefill, running), (last, decoding)]
    activations, gathered = max(moments, key=sum)
    other = int(gathered) + casts + resident
    total = training.params_bytes + grads + training.optimizer_bytes + activations + other
    margin = device_margin(stats, plan, g.prompt_len, total)
    return MemoryEstimate(training.params_bytes, grads, training.optimizer_bytes, int(activations), other, margin)


def reward_model_share(plan: Plan, whole: int) -> int:
    """One rank's share of the reward models: laid out as the policy, sharded over FSDP2's shards (dp_shard x cp) or
    partitioned over DeepSpeed ZeRO-3's data-parallel ranks, else whole (``objectives/grpo.reward_layout``)."""
    from bigtrain.config.capabilities.reference import shards_of  # the frozen copies' rule: the policy's sharding

    return whole // shards_of(plan)


def with_generation(
    stats: ModelStats, plan: Plan, workload: Workload, training: MemoryEstimate, resident: int
) -> MemoryEstimate:
    """The step's peak: its training phase's, or its rollout's where that is larger; both phases' totals kept."""
    g = workload.generation
    if g is None:
        return training
    # the reward models for the whole run, in both phases
    reward = reward_model_share(plan, g.resident_bytes)
    resident += reward
    training = dataclasses.replace(training, other_bytes=training.other_bytes + reward)
    rollout = estimate_generation_memory(stats, plan, workload, training, resident)
    phases = (("generation", rollout.total_bytes), ("training", training.total_bytes))
    peak = rollout if rollout.total_bytes > training.total_bytes else training
    return dataclasses.replace(peak, phases=phases)
