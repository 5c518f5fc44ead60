"""Predicted peak tensor memory of one device for one plan: what ``torch.cuda.max_memory_allocated`` would show.

Every term below says where its bytes come from. Symbols: Ψ = parameters held by the device's pipeline stage and
tensor-parallel rank (``stage_params``), S = dp_shard, b = micro_batch_size, L = seq_len, a = bytes of the compute
dtype (2 for bf16/fp16, 4 for fp32).

Model states (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1: "(2 + 2 + K)Ψ" with K = 12 for mixed-precision Adam):
- fsdp2 (what bigtrain's trainer runs): fp32 sharded parameters 4Ψ/S, fp32 sharded gradients 4Ψ/S, AdamW m and v
  8Ψ/S. Compute copies (bf16) exist only while a block is gathered (see "other").
- ddp: 4Ψ + 4Ψ + 8Ψ, nothing sharded.
- deepspeed ZeRO-1/2/3 (the paper's accounting): 2Ψ compute params + 2Ψ grads + 12Ψ fp32 master, m, v; stage 1
  shards the 12Ψ, stage 2 also the grads, stage 3 also the params; ``offload_optimizer`` moves the 12Ψ to the host.
Transient buffers ("other"): FSDP2 all-gathers one block at a time and prefetches the next, so two unsharded blocks
(a bytes per parameter) are in flight, plus their unsharded gradients in backward before the reduce-scatter (a bytes,
cast to fp32 for the reduction: 4 bytes); the root unit (embeddings, head) stays gathered from forward to backward.
ZeRO-2 mode (reshard_after_forward=False) keeps every block gathered until its backward. Gradient accumulation with
sync only on the last micro-step keeps *unsharded* fp32 gradients of every block between micro-steps.
Activations: per decoder block and token, the tensors autograd saves in HF's implementation (counted in
``_block_activation_bytes_per_token``), times b·L, times the blocks whose activations are alive at the peak.
Logits: the last stage materialises b·L·V logits in the compute dtype and the loss upcasts them (4 bytes) and saves
log-softmax (4 bytes); its backward holds gradients of the same size.
Margin (reported apart, added only against the budget): allocator fragmentation and CUDA context/NCCL buffers,
stated as 10% of the peak plus 1.5 GiB (CUDA context ~0.5 GiB and NCCL channels/workspace ~1 GiB on H100-class
systems, torchtitan and DeepSpeed issue reports).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bigtrain.plan.model_stats import ModelStats
from bigtrain.plan.plan import Plan

GiB = 1024**3
MARGIN_FRACTION = 0.10
MARGIN_FIXED = int(1.5 * GiB)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    other_bytes: int
    margin_bytes: int

    @property
    def total_bytes(self) -> int:
        """Predicted peak of tensor memory (the margin is not part of it)."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.other_bytes

    @property
    def budget_bytes(self) -> int:
        """What must fit into the device: the peak plus the margin."""
        return self.total_bytes + self.margin_bytes

    def to_dict(self) -> dict[str, int]:
        return {"total_bytes": self.total_bytes, **asdict(self)}


def stage_layers(stats: ModelStats, pp: int) -> int:
    """Blocks on the most loaded pipeline stage."""
    return -(-stats.layers // pp)


def stage_params(stats: ModelStats, plan: Plan) -> tuple[int, int]:
    """(block parameters, root parameters) on the busiest stage, per tensor-parallel rank.

    With pp > 1 the first stage holds the embeddings and the last the head; the larger of the two is taken.
    Tensor parallelism splits every projection and the vocabulary; norms are replicated (negligible, ignored).
    """
    blocks = stage_layers(stats, plan.pp) * stats.block_params
    root = stats.root_params if plan.pp == 1 else max(stats.embed_params, stats.head_params + stats.norm_params)
    return blocks // plan.tp, root // plan.tp


def _block_activation_bytes_per_token(stats: ModelStats, a: int) -> int:
    """Bytes autograd keeps for one decoder block per token, no checkpointing.

    Llama-family (HF modeling_llama, sdpa): each RMSNorm saves its fp32 input (4h), the normalised input in the
    compute dtype (ah) and its output (ah); q and k are saved three times around RoPE (input, rotate_half, rotated:
    3a each), v once; SDPA's output and the contiguous copy o_proj saves (2a·q_width); SwiGLU saves gate, silu(gate),
    up and their product (4a·ffn); SDPA's log-sum-exp (4 bytes per head).
    GPT-2: two LayerNorms save input and output (2ah each), c_attn's q, k, v (3ah), SDPA output and merge copy (2ah),
    the MLP saves c_fc's output and its tanh-GELU intermediates (counted as 4 tensors of a·ffn) and the GELU output.
    """
    h, f = stats.hidden, stats.ffn
    if stats.gated_mlp:
        norms = 2 * (4 * h + 2 * a * h)
        attn = 3 * a * stats.q_width + 3 * a * stats.kv_width + a * stats.kv_width + 2 * a * stats.q_width
        return norms + attn + 4 * a * f + 4 * stats.heads
    norms = 2 * (2 * a * h)
    attn = 3 * a * h + 2 * a * h
    return norms + attn + 5 * a * f + 4 * stats.heads


def activation_bytes(stats: ModelStats, plan: Plan, seq_len: int, a: int, micro_batches: int) -> int:
    """Activations alive at the peak on the busiest stage (excluding the logits, counted apart)."""
    tokens = plan.micro_batch_size * seq_len
    per_block = _block_activation_bytes_per_token(stats, a) * tokens // plan.tp
    layers = stage_layers(stats, plan.pp)
    if plan.activation_checkpointing == "full":
        # only each block's input survives; one block is recomputed at a time during backward
        kept = layers * a * stats.hidden * tokens + per_block
    elif plan.activation_checkpointing == "selective":
        # attention internals (q/k/v after RoPE, SDPA output) are recomputed, MLP and norms kept
        attn = (3 * stats.q_width + 4 * stats.kv_width + 2 * stats.q_width) * a * tokens // plan.tp
        kept = layers * (per_block - attn) + attn
    else:
        kept = layers * per_block
    if plan.pp > 1:
        # 1F1B keeps at most pp micro-batches in flight on the first stage; GPipe keeps all of them
        in_flight = min(plan.pp, micro_batches) if plan.pp_schedule == "1f1b" else micro_batches
        kept *= in_flight
    return kept


def logits_bytes(stats: ModelStats, plan: Plan, seq_len: int, a: int) -> int:
    """Peak of the loss: logits (a) + fp32 upcast (4) + saved log-softmax (4), vocabulary split over tp."""
    return plan.micro_batch_size * seq_len * stats.vocab // plan.tp * (a + 4 + 4)


def estimate_memory(
    stats: ModelStats, plan: Plan, seq_len: int, mixed_precision: str, global_batch_size: int
) -> MemoryEstimate:
    a = DTYPE_BYTES[mixed_precision]
    blocks, root = stage_params(stats, plan)
    psi = blocks + root
    accum = max(1, global_batch_size // (plan.micro_batch_size * plan.dp))
    one_block = stats.block_params // plan.tp
    other = 0
    if plan.backend == "fsdp2":
        shard = plan.dp_shard
        params, grads, optim = 4 * psi // shard, 4 * psi // shard, 8 * psi // shard
        if plan.offload_params:  # CPUOffloadPolicy: sharded params, grads and the optimizer step live on the host
            params = grads = optim = 0
        if shard > 1 or a != 4:
            gathered_blocks = blocks if plan.zero_stage == 2 else 2 * one_block
            other += a * (gathered_blocks + root)  # unsharded compute copies in flight
            other += (a + 4) * one_block  # one block's unsharded gradients before its reduce-scatter
        if accum > 1:
            other += 4 * psi  # unsharded gradients accumulated between micro-steps (sync only on the last)
    elif plan.backend == "ddp":
        params, grads, optim = 4 * psi, 4 * psi, 8 * psi
    else:  # deepspeed, ZeRO paper accounting
        dp = plan.dp
        params = 2 * psi // (dp if plan.zero_stage >= 3 else 1)
        grads = 2 * psi // (dp if plan.zero_stage >= 2 else 1)
        optim = 0 if plan.offload_optimizer else 12 * psi // (dp if plan.zero_stage >= 1 else 1)
        if plan.zero_stage >= 3:
            other += a * 2 * one_block  # gathered current + prefetched block
    micro_batches = accum
    activations = activation_bytes(stats, plan, seq_len, a, micro_batches) + logits_bytes(stats, plan, seq_len, a)
    peak = params + grads + optim + activations + other
    margin = int(MARGIN_FRACTION * peak) + MARGIN_FIXED
    return MemoryEstimate(params, grads, optim, activations, other, margin)
