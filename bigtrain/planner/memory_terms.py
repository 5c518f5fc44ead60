"""The memory terms every estimate shares: model states per rank, activations, logits, the device margin.

``data_parallel_memory.py`` (FSDP2, DDP), ``deepspeed_memory.py`` and ``pipeline_memory.py`` build their peaks from
these terms; ``memory.py`` picks the estimate for a plan. Every term says where its bytes come from. Symbols: Ψ =
parameters held by the device's pipeline stage and tensor-parallel rank (``stage_params``), S = dp_shard, b =
micro_batch_size, L = seq_len, a = bytes of the compute dtype (2 for bf16/fp16, 4 for fp32).

Activations: per decoder block and token, the tensors autograd saves in HF's implementation (listed in
``block_activation_bytes_per_token``), times b·L, times the blocks whose activations are alive at the peak.
Loss: the logits' backward holds the log-softmax output, its gradient and the input gradient, all fp32 (the
compute-dtype logits are not saved by the upcast): 12 bytes per logit, b·L·V logits (also with tp: the head is
replicated). With ``loss_parallel`` each tp rank holds b·L·V/tp logits, but torch's vocabulary-parallel
cross-entropy runs log-softmax and its backward as separate element-wise ops on the shards: 16 bytes per local
logit at the peak in bf16 and in fp32 (measured on real tensors for three models; as if four fp32 tensors of the
local size were alive together; fake tensors over-count it, see simulate.py), i.e. 16/tp against 12 per full logit.
Margin (reported apart, added only against the budget; ``device_margin``): the CUDA context and NCCL's buffers, 1.5
GiB (context ~0.5 GiB, NCCL channels/workspace ~1 GiB on H100-class systems: torchtitan and DeepSpeed issue
reports), plus what the caching allocator reserves beyond the allocated peak. That was measured on an H200 for 18
plans (bench/results/rank0_h200.md): 1.9 to 11.2 GiB, 9-72% of the peak, largest where big transient buffers of
varying sizes come and go (the fp32 logits of a micro-batch, a block's fp32 gradients for the reduce-scatter). It
follows neither the peak nor those buffers alone; the larger of 10% of the peak and twice (fp32 logits + one block's
fp32 gradients) covers 17 of the 18 (not an fp32 Qwen2.5-7B plan whose attention fell back to CUDA's math kernel).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.model_stats import ModelStats

GiB = 1024**3
MARGIN_FRACTION = 0.10
MARGIN_FIXED = int(1.5 * GiB)
FRAGMENTATION = 2.0  # allocator reserve, in units of the largest transient buffers (see the module docstring)


@dataclass(frozen=True)
class MemoryEstimate:
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    other_bytes: int
    margin_bytes: int
    # the totals of a step's phases where it has several (online RL: generation, then training), the peak's first
    phases: tuple[tuple[str, int], ...] = ()

    @property
    def total_bytes(self) -> int:
        """Predicted peak of tensor memory (the margin is not part of it)."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.other_bytes

    @property
    def budget_bytes(self) -> int:
        """What must fit into the device: the peak plus the margin."""
        return self.total_bytes + self.margin_bytes

    def to_dict(self) -> dict[str, Any]:
        """The JSON contract's memory: the total and its parts, and each phase's total where a step has several."""
        out: dict[str, Any] = {"total_bytes": self.total_bytes, **asdict(self)}
        phases = out.pop("phases")
        return {**out, "phases": dict(phases)} if phases else out


def stage_layers(stats: ModelStats, pp: int) -> int:
    """Blocks on the most loaded pipeline stage."""
    return -(-stats.layers // pp)


def state_shards(plan: Plan) -> int:
    """Ranks the parameters, gradients and optimizer states are sharded over: dp_shard x cp for FSDP2 (HSDP
    replicates over dp_replicate; the cp ranks of a row hold the same parameters and shard them too), every
    data-parallel rank for DeepSpeed ZeRO, none for DDP."""
    return {"fsdp2": plan.dp_shard * plan.cp, "deepspeed": plan.dp}.get(plan.backend, 1)


def rank_seq_len(plan: Plan, seq_len: int) -> int:
    """The tokens of one row that one rank computes: the whole row, or its 1/cp slice under context parallelism
    (every per-token activation, the logits and the loss scale with it; attention, exchanged by all-to-all, holds
    all the row's tokens for 1/cp of the heads: the same bytes)."""
    return seq_len // plan.cp


def stage_params(stats: ModelStats, plan: Plan) -> tuple[int, int]:
    """(block parameters, root parameters) on the busiest stage, per tensor-parallel rank.

    With pp > 1 the first stage holds the embeddings and the last the head; the larger of the two is taken.
    Tensor parallelism splits every projection of the blocks (their norms are replicated: negligible, ignored); the
    embeddings and final norm stay whole on every tp rank, and so does the LM head unless ``loss_parallel`` splits
    it over the vocabulary.
    """
    # a vision-language model's tower and projector: units of their own beside the decoder's (pp is refused), whole
    # on every tp rank (tp slices the language model only)
    blocks = stage_layers(stats, plan.pp) * stats.block_params
    head = stats.head_params // plan.tp if plan.loss_parallel else stats.head_params
    root = stats.root_params - stats.head_params + head
    if plan.pp > 1:
        root = max(stats.embed_params, head + stats.norm_params)
    return blocks // plan.tp + stats.vision_params, root


def frozen_params(stats: ModelStats, workload: Workload) -> int:
    """The parameters ``model.freeze`` keeps fixed (a vision-language model's parts): no gradient, no optimizer
    state. Modules named by their own names are not modelled."""
    if not workload.frozen or stats.vision is None:
        return 0
    vision = stats.vision
    sizes = {
        "vision_tower": vision.tower_params,
        "projector": vision.projector_params,
        "language_model": stats.params - vision.params,
    }
    return sum(sizes.get(part, 0) for part in set(workload.frozen))


def gathered_block_params(stats: ModelStats, plan: Plan) -> int:
    """One block's parameters FSDP2 gathers to compute it, per tp rank: all of them, except that under expert
    parallelism a rank gathers only its num_experts / ep experts (the experts unit is sharded over the efsdp ranks
    that hold the same experts)."""
    experts = stats.expert_params
    return (stats.block_params - experts + experts // plan.ep) // plan.tp


def block_activation_bytes_per_token(
    stats: ModelStats, a: int, tp: int = 1, sequence_parallel: bool = False, seq_len: int = 0
) -> int:
    """Bytes autograd keeps for one decoder block per token, no checkpointing, for rows of ``seq_len`` tokens.

    Families without formulas: measured (``block_probe.py``), including what grows with the row (eager attention's
    scores; the formulas' SDPA keeps none).

    Llama family (HF modeling_llama with SDPA; listed with saved-tensor hooks): each RMSNorm saves its input upcast
    to fp32 (4h), its rsqrt (4), the normalised input in the compute dtype (ah) and its output, which the next
    projection saves (ah); RoPE saves nothing of size q (cos and sin need no gradient); SDPA saves q and k after RoPE,
    v (a·q_width + 2a·kv_width), its output, which o_proj saves as a view (a·q_width), and the log-sum-exp (4 bytes
    per head); SwiGLU saves gate, silu(gate), up and their product (4a·ffn).
    GPT-2: two LayerNorms save input and normalised output (2ah each), SDPA q, k, v as views of c_attn's output
    (3ah) and its output (ah), the MLP saves c_fc's output and the tanh-GELU intermediates (counted as 5a·ffn).
    Tensor parallelism (no sequence parallel) splits what lies between a column-wise and a row-wise projection
    (heads, MLP units) over tp; the norms and the projections' inputs see the whole hidden state on every tp rank.
    Sequence parallelism splits the norms' own tensors over tp too (4h + ah + 4 per norm, measured 13.5 MiB less
    against 14 MiB predicted on the simulated step); the projections still save their all-gathered input (ah).
    """
    if stats.profile:
        return round(stats.profile.saved_bytes(a).at(tp, sequence_parallel, seq_len))
    h, f = stats.hidden, stats.ffn
    if stats.gated_mlp:
        norm_own = 4 * h + a * h + 4  # fp32 input, rsqrt, normalised input: on the sequence shard under sp
        norms = 2 * (norm_own // (tp if sequence_parallel else 1) + a * h)
        attn = 2 * a * stats.q_width + 2 * a * stats.kv_width + 4 * stats.heads
        return norms + (attn + 4 * a * f) // tp
    return (2 * (2 * a * h) + 4 * a * h + 4 * stats.heads + 5 * a * f) // tp  # (no tp layout: tp is 1)


def selective_block_bytes_per_token(stats: ModelStats, a: int, tp: int = 1) -> int:
    """Bytes one block keeps per token under per-op selective checkpointing (``SAVED_OPS`` of the
    activation_checkpoint transform): the outputs of its matmuls (q, k, v, o; gate and up or GPT-2's c_fc, down),
    attention's output and log-sum-exp, and the block's input (what the element-wise ops are recomputed from).
    Seen on the simulated step at Llama-3-8B width: 102,531 bytes per block and token against 102,528 here."""
    h, f = stats.hidden, stats.ffn
    matmuls = stats.q_width + 2 * stats.kv_width + h + (2 if stats.gated_mlp else 1) * f + h
    return (a * (matmuls + stats.q_width) + 4 * stats.heads) // tp + a * h


def root_activation_bytes_per_token(stats: ModelStats, a: int, tp: int = 1, sequence_parallel: bool = False) -> int:
    """Outside the blocks: the final norm (as a block norm) and the embedding output; under sequence parallelism
    the norm's own tensors and the embedding output are this rank's sequence shard."""
    split = tp if sequence_parallel else 1
    return (4 * stats.hidden + a * stats.hidden + 4) // split + a * stats.hidden + a * stats.hidden // split


def block_input_bytes(stats: ModelStats, plan: Plan, tokens: int, a: int) -> int:
    """A decoder block's input for ``tokens`` tokens: what full checkpointing keeps of it (a sequence shard under
    sequence parallelism)."""
    return a * stats.hidden * tokens // (plan.tp if plan.sequence_parallel else 1)


def micro_batch_activations(
    stats: ModelStats, plan: Plan, seq_len: int, a: int, layers: float, has_loss: bool = True
) -> tuple[int, int]:
    """(bytes one micro-batch keeps in ``layers`` decoder blocks from its forward to its backward, bytes alive for one
    block at a time during the backward), excluding the logits and what lies outside the blocks. ``has_loss``: the
    device also computes the loss (a pipeline's inner stages do not)."""
    tokens = plan.micro_batch_size * seq_len
    per_block = block_activation_bytes_per_token(stats, a, plan.tp, plan.sequence_parallel, seq_len) * tokens
    if plan.offload_activations:
        # nothing of the blocks waits on the device between forward and backward (offloaded_block_bytes); during a
        # block's backward its own tensors (or its recompute and its fetched input) are there, with what is fetched
        # ahead for the block before it: its input, or all it saved where it was not checkpointed; after the loss
        block_input = block_input_bytes(stats, plan, tokens, a)
        full = plan.activation_checkpointing == "full"
        # the block's backward also holds the gradient of its MLP's intermediate beside the tensors it was saved
        # with, which nothing else frees here (seen on the simulated step: one ffn-wide tensor's worth, within 6%)
        working = a * stats.ffn * tokens // plan.tp
        current = per_block + (block_input if full else 0) + working
        ahead = block_input if full and plan.checkpoint_every == 1 else per_block
        loss = logits_bytes(stats, plan, seq_len, a) if has_loss else 0
        return 0, max(current + ahead - loss, 0)
    if plan.activation_checkpointing == "none":
        return int(layers * per_block), 0
    # parallel.checkpoint_every: blocks 0, k, 2k, ... are checkpointed, the others keep everything
    checkpointed = math.ceil(layers / plan.checkpoint_every)
    plain = (layers - checkpointed) * per_block
    if plan.activation_checkpointing == "full":
        # only each block's input survives (a sequence shard under sp); one block is recomputed at a time during
        # backward, after the loss's buffers are gone: the larger of the two counts
        loss = logits_bytes(stats, plan, seq_len, a) if has_loss else 0
        return int(checkpointed * block_input_bytes(stats, plan, tokens, a) + plain), max(per_block - loss, 0)
    # selective: matmul and attention outputs kept; a block's element-wise tensors come back during its backward,
    # after the loss's buffers are gone (as for full)
    kept = selective_block_bytes_per_token(stats, a, plan.tp) * tokens
    loss = logits_bytes(stats, plan, seq_len, a) if has_loss else 0
    return int(checkpointed * kept + plain), max(per_block - kept - loss, 0)


def offloaded_block_bytes(stats: ModelStats, plan: Plan, seq_len: int, a: int, layers: float) -> int:
    """Bytes one micro-batch's ``layers`` blocks keep in host memory under ``offload_activations``: all each block
    saves, or with full checkpointing each checkpointed block's input (and all of the blocks left between them).
    Seen on the simulated step as the bytes the offload copies out (tests/unit/test_activation_offload.py)."""
    if not plan.offload_activations:
        return 0
    tokens = plan.micro_batch_size * seq_len
    per_block = block_activation_bytes_per_token(stats, a, plan.tp, plan.sequence_parallel, seq_len) * tokens
    if plan.activation_checkpointing != "full":
        return int(layers * per_block)
    checkpointed = math.ceil(layers / plan.checkpoint_every)
    return int(checkpointed * block_input_bytes(stats, plan, tokens, a) + (layers - checkpointed) * per_block)


def activation_bytes(stats: ModelStats, plan: Plan, seq_len: int, a: int) -> int:
    """Activations alive at the peak of one device without pipeline (excluding the logits, counted apart)."""
    kept, transient = micro_batch_activations(stats, plan, seq_len, a, stats.layers)
    outside = root_activation_bytes_per_token(stats, a, plan.tp, plan.sequence_parallel)
    return kept + transient + outside * plan.micro_batch_size * seq_len


def loss_tokens(plan: Plan, seq_len: int) -> int:
    """Tokens whose logits exist at once: the micro-batch's, or one chunk's under ``loss_chunk_tokens`` (the chunked
    loss recomputes each chunk's logits in its own backward)."""
    tokens = plan.micro_batch_size * seq_len
    return min(tokens, plan.loss_chunk_tokens) if plan.loss_chunk_tokens else tokens


# train.compile (measured on one GPU: bench/results/side_by_side_h100.md, rank0_h200.md): inductor fuses each block's
# element-wise chains, so fewer intermediates are saved for backward: 70% of the eager blocks' activations (Llama-3.2-1B
# at 16k tokens on an H200: 8.0 of 26.8 GiB fewer); and the compiled loss keeps the compute-dtype logits' gradient and
# one log-sum-exp per row instead of three fp32 tensors: 4 bytes per logit against 12. Against the H100's peaks of
# the compiled runs: 47.1 GiB predicted for 46.2 measured (untied 1B, 16k tokens, +2.0%), 35.8 for 33.6 (Llama-3-8B's
# width at 4 layers, 8k tokens, +6.7%).
COMPILED_ACTIVATION_SHARE = 0.70  # fitted without checkpointing; checkpointed blocks keep their inputs only
COMPILED_LOGIT_BYTES_PER_DTYPE_BYTE = 2  # 4 bytes per logit in bf16: the gradient and the saved logits' share


def compiled_activation_bytes(stats: ModelStats, plan: Plan, seq_len: int, a: int) -> int:
    """``activation_bytes`` + ``logits_bytes`` under train.compile (the constants above; the blocks' share only
    without checkpointing, where it was measured). The chunked and the vocabulary-parallel losses keep the eager
    count of their logits (the first is not compiled, the second not measured)."""
    blocks = activation_bytes(stats, plan, seq_len, a)
    if plan.activation_checkpointing == "none":
        blocks = int(COMPILED_ACTIVATION_SHARE * blocks)
    logits = logits_bytes(stats, plan, seq_len, a)
    if not plan.loss_chunk_tokens and not (plan.tp > 1 and plan.loss_parallel):
        logits = logits * COMPILED_LOGIT_BYTES_PER_DTYPE_BYTE * a // 12
    return blocks + logits


def logits_bytes(stats: ModelStats, plan: Plan, seq_len: int, a: int) -> int:
    """Peak of the loss backward: 12 bytes per logit (see the module docstring); the LM head is replicated over tp,
    so every tp rank computes the whole vocabulary's logits, unless ``loss_parallel`` shards them. Under a chunked
    loss, one chunk's logits."""
    tokens = loss_tokens(plan, seq_len)
    if plan.loss_parallel:
        return tokens * (stats.vocab // plan.tp) * 16
    if plan.loss_chunk_tokens and plan.micro_batch_size * seq_len > plan.loss_chunk_tokens:
        # with several chunks, a compute-dtype logits tensor of a chunk is alive beside the fp32 ones: 12 + a bytes
        # per logit (seen on the simulated step at Llama-3-8B width, bf16: a constant 0.56 GiB more than 12 bytes
        # for chunks of 2048 tokens, at 4k to 32k tokens per micro-batch; one chunk covering the micro-batch: 12)
        return tokens * stats.vocab * (12 + a)
    # a soft-capped head (Gemma 2) also keeps tanh's output in the compute dtype for its backward (seen on the
    # simulated step at Gemma-2-9B width: 3.9 GiB for 8192 tokens of its 256k vocabulary, a bytes per logit)
    return tokens * stats.vocab * (12 + (a if stats.logit_softcap else 0))


def device_margin(stats: ModelStats, plan: Plan, seq_len: int, peak: int) -> int:
    """CUDA context and NCCL, plus the allocator's reserve beyond the allocated ``peak`` (module docstring)."""
    vocab = stats.vocab // (plan.tp if plan.loss_parallel else 1)
    transient = 4 * loss_tokens(plan, seq_len) * vocab + 4 * gathered_block_params(stats, plan)
    return MARGIN_FIXED + int(max(MARGIN_FRACTION * peak, FRAGMENTATION * transient))


def host_offload_bytes(stats: ModelStats, plan: Plan) -> int:
    """Host memory per GPU that an offloading plan moves there: fp32 parameters (FSDP2) or DeepSpeed's fp32 master
    copy, fp32 gradients and AdamW's two states, each a 1/S shard (16 bytes per parameter over S), plus ZeRO-3's
    compute-dtype parameter partition when DeepSpeed offloads parameters too. 0 without offload."""
    if not (plan.offload_params or plan.offload_optimizer):
        return 0
    blocks, root = stage_params(stats, plan)
    shard = state_shards(plan)
    states = 16 * (blocks + root) // shard
    if plan.backend == "deepspeed" and plan.offload_params:
        states += 2 * (blocks + root) // shard
    return states
