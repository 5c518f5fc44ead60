"""Predicted peak tensor memory of one device for an FSDP2 or DDP plan without pipeline stages.

Symbols and the shared terms (activations, logits, margin) are those of ``memory_terms.py``.
Model states (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1: "(2 + 2 + K)Ψ" with K = 12 for mixed-precision Adam):
- fsdp2 (what bigtrain's trainer runs): fp32 sharded parameters 4Ψ/S, fp32 sharded gradients 4Ψ/S, AdamW m and v
  8Ψ/S. Compute copies (bf16) exist only while a block is gathered (see "other").
- ddp: 4Ψ + 4Ψ + 8Ψ, nothing sharded.
The peak is the larger of two moments (tracked with torch's memory tracker, see simulate.py):
- the start of the loss backward of the last micro-step: model states; the gradients accumulated so far, which
  depend on ``grad_reduce`` when the global batch takes several micro-steps: sharded fp32 gradients 4Ψ/S with
  ``every_micro_step`` (each micro-step reduce-scatters into them; HSDP keeps its not yet all-reduced partial sum
  of the same size), the *unsharded* fp32 gradients 4Ψ with ``once_per_step`` (no reduction before the last
  micro-step, so every rank holds the whole stage's gradient); none with a single micro-step; gathered parameters
  in the compute dtype (the root unit, i.e. embeddings and head, stays gathered from forward to backward; ZeRO-3
  mode has the next block prefetched, ZeRO-2 mode keeps every block gathered), DDP's compute-dtype weight copies
  that autocast made and autograd saved (aΨ under bf16/fp16 without checkpointing, the LM head's with full
  checkpointing), all blocks' activations and the loss;
- the optimizer step: parameters, gradients and AdamW states, plus one state-sized temporary of torch's foreach
  AdamW (sqrt of v);
- fsdp2 only, a block's backward (``fsdp2_block_backward``): where blocks are wide against the logits (70B-class
  widths, short sequences, small vocabularies) this moment is the peak, up to 47% above the loss moment;
- fsdp2 only, the embedding's backward (``fsdp2_embedding_backward``): with a large tied vocabulary and short
  sequences the embedding gradient's three copies make this the peak.
"""

from __future__ import annotations

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.memory_terms import (
    MemoryEstimate,
    activation_bytes,
    block_activation_bytes_per_token,
    compiled_activation_bytes,
    device_margin,
    frozen_params,
    gathered_block_params,
    logits_bytes,
    micro_batch_activations,
    rank_seq_len,
    stage_layers,
    stage_params,
    state_shards,
)
from bigtrain.planner.model_stats import ModelStats


def estimate_data_parallel_memory(stats: ModelStats, plan: Plan, workload: Workload) -> MemoryEstimate:
    """The predicted peak of an FSDP2 or DDP plan (pp = 1) and its parts at the moment it happens."""
    seq_len, a = rank_seq_len(plan, workload.seq_len), workload.dtype_bytes
    blocks, root = stage_params(stats, plan)
    psi = blocks + root
    accum = plan.grad_accum_steps(workload.global_batch_size)
    # compute-dtype copies of parameters alive at the loss: the root unit (never resharded after forward) and under
    # ZeRO-2 every block; ZeRO-3 has resharded every block, the last one included (seen on the simulated step: the
    # unsharded parameters at the loss are the root's alone, at Llama-3-8B, OLMo-2-7B and Qwen3-30B-A3B widths)
    gathered = 0
    accumulated = 0  # gradients alive at the loss
    trained = psi - frozen_params(stats, workload) // plan.tp  # model.freeze: no gradient, no optimizer state
    if plan.backend == "fsdp2":
        shard = state_shards(plan)
        params, grads, optim = 4 * psi // shard, 4 * trained // shard, 8 * trained // shard
        if plan.offload_params:  # CPUOffloadPolicy: sharded params, grads and the optimizer step live on the host
            params = grads = optim = 0
        gathered = a * (root + (gathered_blocks(stats, plan, blocks) if plan.zero_stage == 2 else 0))
        if accum > 1 and plan.grad_reduce == "once_per_step":
            accumulated = 4 * trained  # unsharded fp32 gradients kept between micro-steps (sync only on the last)
        elif accum > 1:
            accumulated = grads  # sharded gradients (or HSDP's partial sum) from the earlier micro-steps
        optimizer_temp = 4 * trained // shard if not plan.offload_params else 0
    else:  # ddp
        params, grads, optim = 4 * psi, 4 * trained, 8 * trained
        accumulated = grads  # with gradient_as_bucket_view the gradients are DDP's buckets, allocated up front
        if a != 4:
            # autocast's compute-dtype weight copies outlive forward only where autograd saved them for backward:
            # every projection without checkpointing; with full checkpointing only the LM head (even when tied)
            kept = blocks if plan.activation_checkpointing == "none" else 0
            head = 0 if plan.loss_chunk_tokens else stats.vocab * stats.hidden // plan.tp  # chunks recompute it
            gathered = a * (kept + head)
        optimizer_temp = 4 * trained
    if workload.compile:
        activations = compiled_activation_bytes(stats, plan, seq_len, a)
    else:
        activations = activation_bytes(stats, plan, seq_len, a) + logits_bytes(stats, plan, seq_len, a)
    # the parts at each moment: (grads, activations, other); params and optimizer states are the same in all
    at_loss = (accumulated, activations, gathered)
    at_step = (grads, 0, optimizer_temp)
    moments = [at_loss, at_step]
    if plan.backend == "fsdp2":
        moments.append(fsdp2_block_backward(stats, plan, seq_len, a, accumulated))
        moments.append(fsdp2_embedding_backward(stats, plan, a, accumulated))
    peak = max(moments, key=sum)
    margin = device_margin(stats, plan, seq_len, params + optim + sum(peak))
    return MemoryEstimate(params, peak[0], optim, peak[1], peak[2], margin)


def gathered_blocks(stats: ModelStats, plan: Plan, blocks: int) -> int:
    """What ZeRO-2 mode keeps gathered of the stage's ``blocks`` parameters: all, or under ep each block's own
    experts only."""
    return blocks if plan.ep == 1 else stage_layers(stats, plan.pp) * gathered_block_params(stats, plan)


def fsdp2_block_backward(stats: ModelStats, plan: Plan, seq_len: int, a: int, accumulated: int) -> tuple[int, int, int]:
    """(grads, activations, other) during the backward of a decoder block under FSDP2, after the first.

    Found on the simulated step at Llama-3-70B width (bench/results/memory_matrix.md): there the loss moment left out
    3.2 GiB of a 13.9 GiB peak. What is alive then, besides the model states:
    - gradients: those accumulated over earlier micro-steps (``accumulated``) and the shard the previous block
      reduced into (the optimizer left none: it zeroes them to None); the LM head's compute-dtype gradient (it arrives
      first in backward, and the root unit, which holds it, reduce-scatters only at the end); the block's own
      compute-dtype gradients; and the previous block's fp32 reduce-scatter input (reduce_dtype fp32), which FSDP2
      keeps until the next reduce-scatter is issued;
    - parameters: the root gathered, the block gathered, and in ZeRO-3 mode the next block prefetched (with three
      or more blocks: with two, the moment that holds a reduce-scatter input has nothing left to prefetch); ZeRO-2
      mode keeps every block gathered;
    - activations: without checkpointing those of the blocks not yet back-propagated (counted as all: the block
      being back-propagated frees its own as its gradients grow); with full checkpointing every block's input plus
      the block's recomputed activations; with activation offload what ``micro_batch_activations`` says is back on
      the device (the block's tensors and what is fetched ahead). The final norm's and the loss's tensors are gone.
    """
    blocks, root = stage_params(stats, plan)
    one_block = gathered_block_params(stats, plan)  # under ep: this rank's experts only
    tokens = plan.micro_batch_size * seq_len
    head = stats.vocab * stats.hidden // (plan.tp if plan.loss_parallel else 1)  # the tied weight's too
    # the previous block's reduced shard (offloaded gradients go to the host)
    shard = 0 if plan.offload_params else 4 * (stats.block_params // plan.tp) // state_shards(plan)
    grads = accumulated + shard + a * (head + one_block) + 4 * one_block
    if plan.zero_stage == 2:
        gathered = a * (root + gathered_blocks(stats, plan, blocks))
    else:
        gathered = a * (root + one_block * (2 if stats.layers >= 3 else 1))
    kept, transient = micro_batch_activations(stats, plan, seq_len, a, stats.layers, has_loss=False)
    if plan.offload_activations:  # the block's own tensors fetched back and the next block's fetched ahead
        kept += transient
    elif plan.activation_checkpointing == "full":
        kept += block_activation_bytes_per_token(stats, a, plan.tp, plan.sequence_parallel, seq_len) * tokens
    return grads, kept, gathered


def fsdp2_embedding_backward(stats: ModelStats, plan: Plan, a: int, accumulated: int) -> tuple[int, int, int]:
    """(grads, activations, other) when the embedding's gradient arrives, the last of the backward under FSDP2.

    The root unit is still gathered (``other``) and holds the LM head's compute-dtype gradient; the embedding's own
    gradient is a dense vocabulary x hidden tensor; with tied embeddings it is added to the head's, out of place, so
    three such tensors are alive at once (seen on the simulated step: 5.9 GiB of Temp at Llama-3-70B width with a
    tied 128k vocabulary, 3 x 1.96 GiB); the first block's fp32 reduce-scatter input is still alive, and every block
    has reduced into its gradient shard. No activations are left.
    """
    blocks, root = stage_params(stats, plan)
    one_block = gathered_block_params(stats, plan)
    shards = 0 if plan.offload_params else 4 * (blocks + root) // state_shards(plan)
    head = a * stats.vocab * stats.hidden // (plan.tp if plan.loss_parallel else 1)
    copies = head + a * stats.embed_params + (head if stats.tied else 0)  # tied: the out-of-place sum
    gathered = root if plan.zero_stage == 3 else root + gathered_blocks(stats, plan, blocks)
    return max(accumulated, shards) + copies + 4 * one_block, 0, a * gathered
