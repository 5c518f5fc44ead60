"""Memory and time terms of adapter plans (``train.method`` lora or qlora), and the peak of such a plan.

What changes against full fine-tuning (symbols of ``memory_terms.py``; Ψ_b the frozen base on the device's stage,
Ψ_a the adapters, r = ``lora.r``; the planner assumes peft's default targets, every linear of the decoder blocks):
- adapters: r·(in + out) parameters per adapted linear, e.g. r·(7h + 2·q_width + 2·kv_width + 3·ffn) per Llama
  block (q, k, v, o, gate, up, down); fp32 weights, fp32 gradients and AdamW's two states: 16 bytes each, sharded
  like full fine-tuning's states;
- the frozen base: no gradient, no optimizer state, no fp32 master: the compute dtype (a bytes per parameter) under
  LoRA; under QLoRA the blocks' linears are NF4 (4 bits, one 8-bit scale per 64 values and one fp32 scale per 256
  scales: NF4_BYTES ≈ 0.516 bytes per parameter) and the rest (embeddings, norms, LM head) the compute dtype;
- what is gathered to compute (FSDP2): the same units as full fine-tuning, in the base's storage (NF4 blocks stay
  4-bit when gathered); QLoRA dequantises one linear at a time: the largest linear's compute-dtype weight in flight;
- activations: full fine-tuning's tensors (a frozen linear does not save its input, but the adapter's lora_A saves
  that same input for its weight gradient) less what the norms' frozen weights need no more: an RMSNorm's product
  with its weight saves the normalised input (a·h) only for the weight's gradient, 2a·h per block and a·h for the
  final norm per token (seen on the simulated step: 184,456 of the 200,840 bytes per block and token at
  Llama-3-8B width, exactly); plus each adapter's r-wide output (r·a per adapted linear and token); with
  lora.dropout > 0 a dropout output and mask per adapted linear (not modelled: the default is 0);
- gathered at the loss: FSDP2 ZeRO-3 keeps only the root unit (embeddings, head) gathered, every block is
  resharded (ZeRO-2 keeps all of them);
- the blocks' gathering at the start of the forward, a moment of its own: with no gradients to hold, FSDP2's
  buffers are the peak where blocks are wide against the logits (70B-class widths, short sequences). Found on the
  simulated step at Llama-3-70B width: the root unit plus 7.15 GiB = 4.49 blocks in the compute dtype (all-gather
  outputs, their copies out and the next block prefetched), the same for 16 and 64 ranks, 1024 and 2048 tokens,
  with and without checkpointing (so no activations yet): ALL_GATHER_BLOCKS = 4.5 under ZeRO-3, 2 under ZeRO-2;
  QLoRA's dequantised linear in flight on top;
- no embedding or LM-head gradient, so full fine-tuning's moments of the embedding's backward and of full-size
  block gradients do not arise.
Time (``cost.py`` reads these): the base's weight gradients are skipped, ≈ 4N FLOPs per token instead of 6N, plus
6 per adapter parameter; QLoRA dequantises every NF4 weight in each forward and backward pass (read 0.5, write a
bytes per parameter) at the GPU's memory bandwidth; data-parallel traffic gathers the base in its storage dtype and
reduces only the adapters' gradients.
"""

from __future__ import annotations

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.memory_terms import (
    MemoryEstimate,
    activation_bytes,
    device_margin,
    logits_bytes,
    rank_seq_len,
    stage_layers,
    stage_params,
    state_shards,
)
from bigtrain.planner.model_stats import ModelStats

NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit values, 8-bit block scales, fp32 scales of the scales
ADAPTED_LINEARS = {True: 7, False: 4}  # per block: Llama-style (gated MLP) and GPT-2
# FSDP2 ZeRO-3 gathering the first blocks: buffers worth this many blocks at once (module docstring)
ALL_GATHER_BLOCKS = 4.5


def adapter_params_per_block(stats: ModelStats, r: int) -> int:
    """r·(in + out) over every linear of one decoder block (measured families: over its nn.Linear modules; the
    fused expert weights of transformers' mixtures are not nn.Linear, and peft leaves them alone)."""
    if stats.profile:
        return round(r * stats.profile.block.linear_in_out)
    h, f = stats.hidden, stats.ffn
    if stats.gated_mlp:
        return r * (7 * h + 2 * stats.q_width + 2 * stats.kv_width + 3 * f)
    return r * (8 * h + 2 * f)  # GPT-2: c_attn (h -> 3h), attn c_proj, c_fc, mlp c_proj


def adapter_params(stats: ModelStats, r: int) -> int:
    """Trainable parameters of the whole model under LoRA/QLoRA."""
    return stats.layers * adapter_params_per_block(stats, r)


def _module_params(stats: ModelStats) -> tuple[dict[str, int], dict[str, int]]:
    """Parameters of the modules ``lora.modules_to_save`` can name, by their full name: outside the blocks, and in
    the first block (the rest repeat it). A tied LM head is the embedding's weight (0 of its own)."""
    if stats.model_type == "gpt2":
        root = {"transformer.wte": stats.vocab * stats.hidden, "transformer.wpe": stats.positions * stats.hidden}
        root |= {"transformer.ln_f": stats.norm_params, "lm_head": stats.vocab * stats.hidden}
        block = {"attn": stats.attn_params, "mlp": stats.mlp_params, "ln_1": stats.norm_params}
        block |= {"ln_2": stats.norm_params}
        prefix = "transformer.h.0."
    else:
        root = {"model.embed_tokens": stats.vocab * stats.hidden, "model.norm": stats.norm_params}
        root |= {"lm_head": stats.vocab * stats.hidden}
        block = {"self_attn": stats.attn_params, "mlp": stats.mlp_params, "input_layernorm": stats.norm_params}
        block |= {"post_attention_layernorm": stats.norm_params}
        prefix = "model.layers.0."
    return root, {prefix + name: n for name, n in block.items()}


def fully_trained_params(stats: ModelStats, workload: Workload) -> tuple[int, int]:
    """(parameters outside the blocks, parameters per block) of the modules trained fully beside the adapters
    (``lora.modules_to_save``, peft's rule: a module's name ends with the entry). A tied embedding and LM head are
    one weight, counted once whichever of the two is named."""
    root, block = _module_params(stats)
    chosen = {name for name in (*root, *block) for entry in workload.modules_to_save if name.endswith(entry)}
    embed = "transformer.wte" if stats.model_type == "gpt2" else "model.embed_tokens"
    if stats.tied and "lm_head" in chosen:
        chosen = (chosen - {"lm_head"}) | {embed}
    return sum(n for k, n in root.items() if k in chosen), sum(n for k, n in block.items() if k in chosen)


def _trained_vocabulary_weights(stats: ModelStats, workload: Workload) -> tuple[bool, bool]:
    """(the LM head's weight is trained fully, the embedding's is): named, or (tied) the other named."""
    embed = "transformer.wte" if stats.model_type == "gpt2" else "model.embed_tokens"
    head = any("lm_head".endswith(e) for e in workload.modules_to_save)
    embedding = any(embed.endswith(e) for e in workload.modules_to_save)
    return (head or embedding, head or embedding) if stats.tied else (head, embedding)


def trained_head(stats: ModelStats, workload: Workload) -> bool:
    """Whether the LM head's weight is trained fully (named, or the tied embedding named)."""
    return _trained_vocabulary_weights(stats, workload)[0]


def trained_params(stats: ModelStats, workload: Workload) -> int:
    """Every trained parameter of an adapter plan: the adapters and the modules trained fully."""
    root, block = fully_trained_params(stats, workload)
    return adapter_params(stats, workload.lora_rank) + root + stats.layers * block


def base_bytes(stats: ModelStats, plan: Plan, workload: Workload) -> tuple[float, float]:
    """(bytes of the frozen blocks, bytes of the frozen root) per tensor-parallel rank of the busiest stage."""
    blocks, root = stage_params(stats, plan)
    trained_root, trained_block = fully_trained_params(stats, workload)
    blocks -= stage_layers(stats, plan.pp) * trained_block // plan.tp
    root -= trained_root
    a = workload.dtype_bytes
    block_bytes = NF4_BYTES if workload.method == "qlora" else a
    return blocks * block_bytes, root * a


def largest_linear(stats: ModelStats) -> int:
    return stats.hidden * max(stats.ffn, stats.q_width)


def adapter_flops_per_token(stats: ModelStats, seq_len: int, workload: Workload) -> float:
    """Forward (2N) and input gradients (2N) of the matmuls, the adapters' own 6 per parameter, the weight gradients
    (2 per parameter) of the LM head and of block modules trained fully, and attention (12·layers·L·d: its scores
    have no weights, so both backward matmuls stay). An embedding trained fully adds a scatter, not a matmul."""
    _, block = fully_trained_params(stats, workload)
    weight_grads = stats.layers * block + (stats.vocab * stats.hidden if trained_head(stats, workload) else 0)
    adapters = adapter_params(stats, workload.lora_rank)
    # per block: two forwards' worth (forward, input gradients) and attention's weightless backward once more
    blocks = stats.layers * (2.0 * stats.block_forward_flops(seq_len) + stats.attention_forward_flops(seq_len))
    return blocks + 4.0 * stats.vocab * stats.hidden + 6.0 * adapters + 2.0 * weight_grads


def dequant_bytes(stats: ModelStats, plan: Plan, workload: Workload) -> float:
    """Bytes one rank's QLoRA dequantisation moves per micro-step: every NF4 weight of its stage read (NF4_BYTES)
    and written in the compute dtype, in forward, in backward, and in the recompute of full checkpointing."""
    if workload.method != "qlora":
        return 0.0
    passes = 3 if plan.activation_checkpointing == "full" else 2
    weights = stage_layers(stats, plan.pp) * stats.block_params / plan.tp
    return passes * weights * (NF4_BYTES + workload.dtype_bytes)


def estimate_adapter_memory(stats: ModelStats, plan: Plan, workload: Workload) -> MemoryEstimate:
    """The predicted peak of an adapter plan on FSDP2, DDP or DeepSpeed (pp = tp = 1: see the capability table)."""
    seq_len, a = rank_seq_len(plan, workload.seq_len), workload.dtype_bytes
    blocks, root = base_bytes(stats, plan, workload)
    one_block = blocks / stats.layers
    psi_a = trained_params(stats, workload) / plan.tp
    gathered_root = root + a * fully_trained_params(stats, workload)[0]  # trained ones too, in the compute dtype
    accum = plan.grad_accum_steps(workload.global_batch_size)
    if plan.backend == "fsdp2":
        shard = state_shards(plan)
        base = 0.0 if plan.offload_params else (blocks + root) / shard
        gathered = gathered_root + (blocks if plan.zero_stage == 2 else 0.0)
    elif plan.backend == "deepspeed":
        shard = plan.dp
        base = (blocks + root) / (shard if plan.zero_stage == 3 else 1)
        gathered = gathered_root + one_block if plan.zero_stage == 3 else 0.0
    else:  # ddp
        shard, base, gathered = 1, blocks + root, 0.0
    if plan.offload_params or plan.offload_optimizer:
        adapter_states = 4 * psi_a / shard if plan.offload_optimizer else 0.0  # the rest on the host
        params, grads, optim = base + adapter_states, 4 * psi_a / shard, 0.0
    else:
        params, grads, optim = base + 4 * psi_a / shard, 4 * psi_a / shard, 8 * psi_a / shard
    tokens = plan.micro_batch_size * seq_len
    adapter_outputs = stats.layers * ADAPTED_LINEARS[stats.gated_mlp] * workload.lora_rank * a * tokens
    norms = 1 + (2 * stats.layers if plan.activation_checkpointing != "full" else 0)  # with frozen weights
    frozen_norms = a * stats.hidden * tokens * norms
    blocks_and_root = activation_bytes(stats, plan, seq_len, a) - frozen_norms + adapter_outputs
    logits = logits_bytes(stats, plan, seq_len, a)
    accumulated = grads if accum > 1 or plan.backend == "ddp" else 0
    at_loss = (accumulated, blocks_and_root + logits, gathered)
    # the blocks' gathering at the start of the forward (module docstring): FSDP2's buffers, no activations yet
    in_flight = a * largest_linear(stats) / plan.tp if workload.method == "qlora" else 0.0
    if plan.backend == "fsdp2":
        buffers = ALL_GATHER_BLOCKS * one_block if plan.zero_stage == 3 else 2 * one_block
    else:
        buffers = one_block if plan.backend == "deepspeed" and plan.zero_stage == 3 else 0.0
    at_gather = (accumulated, 0, gathered_root + buffers + in_flight)
    at_step = (grads, 0, 4 * psi_a / shard)  # foreach AdamW's state-sized temporary, over the adapters
    moments = [at_loss, at_gather, at_step]
    head, embedding = _trained_vocabulary_weights(stats, workload)
    vocab_weight = stats.vocab * stats.hidden
    if plan.backend == "fsdp2" and (head or embedding):
        moments += root_trained_moments(stats, plan, workload, accumulated, head, embedding)
    elif plan.backend == "ddp" and head:
        # autocast's compute-dtype copy of the fp32 LM head, saved for its backward (a frozen bf16 base has none)
        at_loss = (accumulated, at_loss[1], a * vocab_weight)
        moments[0] = at_loss
    peak = max(moments, key=sum)
    margin = device_margin(stats, plan, seq_len, int(params + optim + sum(peak)))
    return MemoryEstimate(int(params), int(peak[0]), int(optim), int(peak[1]), int(peak[2]), margin)


def root_trained_moments(
    stats: ModelStats, plan: Plan, workload: Workload, accumulated: float, head: bool, embedding: bool
) -> list[tuple[float, float, float]]:
    """FSDP2's moments at the end of the backward when the embedding or the LM head is trained fully (the root
    unit then has gradients): full fine-tuning's ``fsdp2_embedding_backward`` over the trained ones (the root
    gathered, the head's and the embedding's compute-dtype gradients, with a tied weight their out-of-place sum as
    a third copy), then the root's reduce-scatter (its compute-dtype gradients and their fp32 copy; every unit
    resharded, ZeRO-2's blocks too). Seen on the simulated step: 3 x 0.73 GiB at Llama-3.2-3B width (tied),
    1.96 + 3.91 GiB at Llama-3-8B width (embedding and head)."""
    a = workload.dtype_bytes
    vocab_weight = stats.vocab * stats.hidden
    root_trained, _ = fully_trained_params(stats, workload)
    _, root = stage_params(stats, plan)
    blocks = base_bytes(stats, plan, workload)[0] if plan.zero_stage == 2 else 0.0  # ZeRO-2 keeps them gathered
    copies = a * vocab_weight * ((head + embedding) if not stats.tied else 3)
    at_embedding = (accumulated + copies, 0, a * root + blocks)
    at_root_reduce = (accumulated + (a + 4) * root_trained, 0, 0)
    return [at_embedding, at_root_reduce]


def adapter_host_bytes(stats: ModelStats, plan: Plan, workload: Workload) -> int:
    """Host memory per GPU that an offloading adapter plan keeps there: the frozen base's shard (FSDP2 offloads
    parameters) and the adapters' fp32 weights, gradients and AdamW states (16 bytes each)."""
    if not (plan.offload_params or plan.offload_optimizer):
        return 0
    shard = state_shards(plan) if plan.backend == "fsdp2" else plan.dp
    states = 16 * trained_params(stats, workload) / plan.tp / shard
    base = sum(base_bytes(stats, plan, workload)) / shard if plan.offload_params else 0.0
    return int(states + base)
