"""Predicted peak tensor memory of one device for one plan: what ``torch.cuda.max_memory_allocated`` would show.

Every term below says where its bytes come from. Symbols: Ψ = parameters held by the device's pipeline stage and
tensor-parallel rank (``stage_params``), S = dp_shard, b = micro_batch_size, L = seq_len, a = bytes of the compute
dtype (2 for bf16/fp16, 4 for fp32).

Model states (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1: "(2 + 2 + K)Ψ" with K = 12 for mixed-precision Adam):
- fsdp2 (what bigtrain's trainer runs): fp32 sharded parameters 4Ψ/S, fp32 sharded gradients 4Ψ/S, AdamW m and v
  8Ψ/S. Compute copies (bf16) exist only while a block is gathered (see "other").
- ddp: 4Ψ + 4Ψ + 8Ψ, nothing sharded.
- deepspeed ZeRO-1/2/3: measured on DeepSpeed's own step, in ``deepspeed_memory.py``.
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

from dataclasses import asdict, dataclass

from bigtrain.config.plan import Plan
from bigtrain.config.schema import PRECISIONS
from bigtrain.planner.model_stats import ModelStats

GiB = 1024**3
MARGIN_FRACTION = 0.10
MARGIN_FIXED = int(1.5 * GiB)
FRAGMENTATION = 2.0  # allocator reserve, in units of the largest transient buffers (see the module docstring)
DTYPE_BYTES = {p: 4 if p == "fp32" else 2 for p in PRECISIONS}


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


def state_shards(plan: Plan) -> int:
    """Ranks the parameters, gradients and optimizer states are sharded over: dp_shard for FSDP2 (HSDP replicates
    over dp_replicate), every data-parallel rank for DeepSpeed ZeRO, none for DDP."""
    return {"fsdp2": plan.dp_shard, "deepspeed": plan.dp}.get(plan.backend, 1)


def stage_params(stats: ModelStats, plan: Plan) -> tuple[int, int]:
    """(block parameters, root parameters) on the busiest stage, per tensor-parallel rank.

    With pp > 1 the first stage holds the embeddings and the last the head; the larger of the two is taken.
    Tensor parallelism splits every projection of the blocks (their norms are replicated: negligible, ignored); the
    embeddings and final norm stay whole on every tp rank, and so does the LM head unless ``loss_parallel`` splits
    it over the vocabulary.
    """
    blocks = stage_layers(stats, plan.pp) * stats.block_params
    head = stats.head_params // plan.tp if plan.loss_parallel else stats.head_params
    root = stats.root_params - stats.head_params + head
    if plan.pp > 1:
        root = max(stats.embed_params, head + stats.norm_params)
    return blocks // plan.tp, root


def block_activation_bytes_per_token(stats: ModelStats, a: int, tp: int = 1, sequence_parallel: bool = False) -> int:
    """Bytes autograd keeps for one decoder block per token, no checkpointing.

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
    h, f = stats.hidden, stats.ffn
    if stats.gated_mlp:
        norm_own = 4 * h + a * h + 4  # fp32 input, rsqrt, normalised input: on the sequence shard under sp
        norms = 2 * (norm_own // (tp if sequence_parallel else 1) + a * h)
        attn = 2 * a * stats.q_width + 2 * a * stats.kv_width + 4 * stats.heads
        return norms + (attn + 4 * a * f) // tp
    return (2 * (2 * a * h) + 4 * a * h + 4 * stats.heads + 5 * a * f) // tp  # (no tp layout: tp is 1)


def root_activation_bytes_per_token(stats: ModelStats, a: int, tp: int = 1, sequence_parallel: bool = False) -> int:
    """Outside the blocks: the final norm (as a block norm) and the embedding output; under sequence parallelism
    the norm's own tensors and the embedding output are this rank's sequence shard."""
    split = tp if sequence_parallel else 1
    return (4 * stats.hidden + a * stats.hidden + 4) // split + a * stats.hidden + a * stats.hidden // split


def micro_batch_activations(
    stats: ModelStats, plan: Plan, seq_len: int, a: int, layers: float, has_loss: bool = True
) -> tuple[int, int]:
    """(bytes one micro-batch keeps in ``layers`` decoder blocks from its forward to its backward, bytes alive for one
    block at a time during the backward), excluding the logits and what lies outside the blocks. ``has_loss``: the
    device also computes the loss (a pipeline's inner stages do not)."""
    tokens = plan.micro_batch_size * seq_len
    per_block = block_activation_bytes_per_token(stats, a, plan.tp, plan.sequence_parallel) * tokens
    if plan.activation_checkpointing == "full":
        # only each block's input survives (a sequence shard under sp); one block is recomputed at a time during
        # backward, after the loss's buffers are gone: the larger of the two counts
        loss = logits_bytes(stats, plan, seq_len, a) if has_loss else 0
        block_input = a * stats.hidden * tokens // (plan.tp if plan.sequence_parallel else 1)
        return int(layers * block_input), max(per_block - loss, 0)
    if plan.activation_checkpointing == "selective":
        # attention internals (q/k/v after RoPE, SDPA output) are recomputed, MLP and norms kept
        attn = (3 * stats.q_width + 4 * stats.kv_width + 2 * stats.q_width) * a * tokens // plan.tp
        return int(layers * (per_block - attn)), attn
    return int(layers * per_block), 0


def activation_bytes(stats: ModelStats, plan: Plan, seq_len: int, a: int) -> int:
    """Activations alive at the peak of one device without pipeline (excluding the logits, counted apart)."""
    kept, transient = micro_batch_activations(stats, plan, seq_len, a, stats.layers)
    outside = root_activation_bytes_per_token(stats, a, plan.tp, plan.sequence_parallel)
    return kept + transient + outside * plan.micro_batch_size * seq_len


def logits_bytes(stats: ModelStats, plan: Plan, seq_len: int, a: int) -> int:
    """Peak of the loss backward: 12 bytes per logit (see the module docstring); the LM head is replicated over tp,
    so every tp rank computes the whole vocabulary's logits, unless ``loss_parallel`` shards them."""
    tokens = plan.micro_batch_size * seq_len
    if plan.loss_parallel:
        return tokens * (stats.vocab // plan.tp) * 16
    return tokens * stats.vocab * 12


def estimate_memory(
    stats: ModelStats, plan: Plan, seq_len: int, mixed_precision: str, global_batch_size: int
) -> MemoryEstimate:
    """The predicted peak and its parts at the moment it happens (loss backward or optimizer step)."""
    if plan.backend == "deepspeed":
        # imported here: deepspeed_memory builds on this module's terms
        from bigtrain.planner.deepspeed_memory import estimate_deepspeed_memory

        return estimate_deepspeed_memory(stats, plan, seq_len, mixed_precision, global_batch_size)
    if plan.pp > 1:
        # imported here: pipeline_memory builds on this module's terms
        from bigtrain.planner.pipeline_memory import estimate_pipeline_memory

        return estimate_pipeline_memory(stats, plan, seq_len, mixed_precision, global_batch_size)
    a = DTYPE_BYTES[mixed_precision]
    blocks, root = stage_params(stats, plan)
    psi = blocks + root
    accum = plan.grad_accum_steps(global_batch_size)
    one_block = stats.block_params // plan.tp
    gathered = 0  # compute-dtype copies of parameters alive at the loss
    accumulated = 0  # gradients alive at the loss
    if plan.backend == "fsdp2":
        shard = plan.dp_shard
        params, grads, optim = 4 * psi // shard, 4 * psi // shard, 8 * psi // shard
        if plan.offload_params:  # CPUOffloadPolicy: sharded params, grads and the optimizer step live on the host
            params = grads = optim = 0
        gathered = a * (root + (blocks if plan.zero_stage == 2 else one_block))
        if accum > 1 and plan.grad_reduce == "once_per_step":
            accumulated = 4 * psi  # unsharded fp32 gradients kept between micro-steps (sync only on the last)
        elif accum > 1:
            accumulated = grads  # sharded gradients (or HSDP's partial sum) from the earlier micro-steps
        optimizer_temp = 4 * psi // shard if not plan.offload_params else 0
    else:  # ddp
        params, grads, optim = 4 * psi, 4 * psi, 8 * psi
        accumulated = grads  # with gradient_as_bucket_view the gradients are DDP's buckets, allocated up front
        if a != 4:
            # autocast's compute-dtype weight copies outlive forward only where autograd saved them for backward:
            # every projection without checkpointing; with full checkpointing only the LM head (even when tied)
            kept = blocks if plan.activation_checkpointing == "none" else 0
            gathered = a * (kept + stats.vocab * stats.hidden // plan.tp)
        optimizer_temp = 4 * psi
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


def device_margin(stats: ModelStats, plan: Plan, seq_len: int, peak: int) -> int:
    """CUDA context and NCCL, plus the allocator's reserve beyond the allocated ``peak`` (module docstring)."""
    vocab = stats.vocab // (plan.tp if plan.loss_parallel else 1)
    transient = 4 * plan.micro_batch_size * seq_len * vocab + 4 * stats.block_params // plan.tp
    return MARGIN_FIXED + int(max(MARGIN_FRACTION * peak, FRAGMENTATION * transient))


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
      the block's recomputed activations. The final norm's and the loss's tensors are gone by then.
    """
    blocks, root = stage_params(stats, plan)
    one_block = stats.block_params // plan.tp
    tokens = plan.micro_batch_size * seq_len
    head = stats.vocab * stats.hidden // (plan.tp if plan.loss_parallel else 1)  # the tied weight's too
    shard = 0 if plan.offload_params else 4 * one_block // plan.dp_shard  # offloaded gradients go to the host
    grads = accumulated + shard + a * (head + one_block) + 4 * one_block
    if plan.zero_stage == 2:
        gathered = a * (root + blocks)
    else:
        gathered = a * (root + one_block * (2 if stats.layers >= 3 else 1))
    kept, _ = micro_batch_activations(stats, plan, seq_len, a, stats.layers, has_loss=False)
    if plan.activation_checkpointing == "full":
        kept += block_activation_bytes_per_token(stats, a, plan.tp, plan.sequence_parallel) * tokens
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
    one_block = stats.block_params // plan.tp
    shards = 0 if plan.offload_params else 4 * (blocks + root) // plan.dp_shard
    head = a * stats.vocab * stats.hidden // (plan.tp if plan.loss_parallel else 1)
    copies = head + a * stats.embed_params + (head if stats.tied else 0)  # tied: the out-of-place sum
    return max(accumulated, shards) + copies + 4 * one_block, 0, a * (root if plan.zero_stage == 3 else root + blocks)


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
