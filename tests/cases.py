"""Every model configuration and plan case the tests and benchmarks share, written once.

- Tiny models (hidden 64, 2 layers) for multi-process training runs: ``TINY_LLAMA`` and the other families in
  ``TINY_MODELS``; ``COUNT_CHECK_MODELS`` for exact parameter counts.
- ``MEMORY_ARCHS`` and ``MEMORY_CASES``: the predicted-vs-simulated peak memory matrix (``bench/memory_matrix.py``
  prints it, ``tests/distributed/test_memory_matrix.py`` asserts it). Wider models: they run on fake tensors.
- ``REAL_WIDTH_ARCHS`` and ``REAL_WIDTH_CASES``: the same comparison at the widths users train (Llama-3 8B/70B,
  Llama-3.2 1B, Qwen2.5 7B, Mistral 7B blocks, 32k-152k vocabularies, 2k-8k tokens, 8 to 1024 ranks), with trimmed
  depth: a block's terms are the same in every layer, so depth only multiplies them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bigtrain.config.plan import DEFAULT_GRAD_REDUCE, Plan
from bigtrain.config.workload import Workload
from bigtrain.job import job_facts
from bigtrain.planner.model_stats import load_model_config

TINY_LLAMA: dict[str, Any] = dict(
    model_type="llama",
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=True,
)

# Architectures beyond the tied-embedding Llama: GPT-2 (Conv1D projections, learned positions, LayerNorm with bias)
# and Qwen2 (q/k/v biases, GQA, untied LM head).
TINY_MODELS: dict[str, dict[str, Any]] = {
    "llama-tied": TINY_LLAMA,
    # GPT-2 defaults to dropout 0.1: random masks would make any two runs differ, so comparisons turn it off.
    "gpt2": dict(
        model_type="gpt2",
        vocab_size=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    ),
    "qwen2-untied": {**TINY_LLAMA, "model_type": "qwen2", "tie_word_embeddings": False},
    # for tensor parallelism: 4 layers, GQA 4:2 (tp=2 splits both head counts), and Qwen2 tied
    "llama-4layers": {**TINY_LLAMA, "num_hidden_layers": 4, "tie_word_embeddings": False},
    "qwen2-tied": {**TINY_LLAMA, "model_type": "qwen2"},
}

# Families whose checkpoints transformers renames or converts at load time (GPT-NeoX's embed_out; the per-expert
# tensors of Mixtral, Qwen3-MoE and DeepSeek-V3, fused per layer in the model): tiny, GQA 4:2 where it applies
_SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)
# Gemma 2: no sdpa in transformers (eager is its default), soft-capped logits and attention, tied embeddings
TINY_GEMMA2: dict[str, Any] = dict(model_type="gemma2", **_SMALL, num_key_value_heads=2, head_dim=8)
CONVERTED_FAMILIES: dict[str, dict[str, Any]] = {
    "gpt_neox": dict(model_type="gpt_neox", **_SMALL),
    "mixtral": dict(model_type="mixtral", **_SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        **_SMALL,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    ),
    "deepseek_v3": dict(
        model_type="deepseek_v3",
        **_SMALL,
        num_key_value_heads=2,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,  # layer 0 dense, layer 1 MoE
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=4,
        qk_nope_head_dim=4,
        v_head_dim=8,
        n_group=1,
        topk_group=1,
    ),
}

# Dense families whose tensor-parallel layouts go beyond colwise/rowwise: Qwen3 (per-head q/k norms replicated with
# summed gradients), Phi-3 (fused qkv and gate_up, outputs gathered, row-wise inputs split) and OLMo-2 (q/k/v
# gathered for its full-width q/k norms); hidden 64 and GQA 4:2, so tp=2 splits both head counts
_TP_SMALL = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
TP_FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": dict(model_type="qwen3", **_TP_SMALL, head_dim=16, vocab_size=128, tie_word_embeddings=False),
    "phi3": dict(model_type="phi3", **_TP_SMALL, vocab_size=128, pad_token_id=None),
    "olmo2": dict(model_type="olmo2", **_TP_SMALL, vocab_size=128, pad_token_id=None),
}
# Mixtral asking for its router's load-balancing loss (weighted 0.1 so that leaving it out moves the gradients)
ROUTED_MIXTRAL: dict[str, Any] = {
    **CONVERTED_FAMILIES["mixtral"],
    "output_router_logits": True,
    "router_aux_loss_coef": 0.1,
}
TINY_MODELS.update({"gemma2": TINY_GEMMA2, **CONVERTED_FAMILIES, **TP_FAMILIES})

# Odd shapes for the exact parameter-count check: untied, tied, GQA 8:2, learned positions, qk-norm with head_dim.
COUNT_CHECK_MODELS: list[dict[str, Any]] = [
    dict(
        model_type="llama",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        tie_word_embeddings=False,
    ),
    dict(
        model_type="qwen2",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        vocab_size=300,
        tie_word_embeddings=True,
    ),
    dict(
        model_type="mistral",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=128,
    ),
    dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_positions=32, vocab_size=100),
    dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_positions=32, vocab_size=100, tie_word_embeddings=False),
    dict(
        model_type="qwen3",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=100,
    ),
]

MEMORY_ARCHS: dict[str, dict[str, Any]] = {
    # dense multi-head attention (kv heads = heads), untied
    "llama-dense": dict(
        model_type="llama",
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        vocab_size=8000,
        tie_word_embeddings=False,
    ),
    # grouped-query attention (4 query heads per KV head)
    "mistral-gqa": dict(
        model_type="mistral",
        hidden_size=512,
        intermediate_size=1792,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=8000,
    ),
    # tied embeddings, q/k/v biases
    "qwen2-tied": dict(
        model_type="qwen2",
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=16000,
        tie_word_embeddings=True,
    ),
    # Qwen2.5's 152k vocabulary on a small body: the logits dominate
    "qwen2-bigvocab": dict(
        model_type="qwen2",
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}


@dataclass(frozen=True)
class MemoryCase:
    arch: str
    backend: str
    zero_stage: int
    world: int
    ac: str
    micro_batch: int
    seq_len: int
    global_batch: int
    precision: str
    grad_reduce: str = "every_micro_step"  # ddp cases: once_per_step
    replicate: int = 1  # fsdp2: HSDP replicas (the rest of the world shards)
    tp: int = 1  # fsdp2: tensor-parallel degree (taken out of dp_shard)
    loss_parallel: bool = False  # tp: LM head and loss sharded over the vocabulary (measured on real tensors)
    sequence_parallel: bool = False  # tp: norms and residual stream split over the sequence
    pp: int = 1  # fsdp2: pipeline stages (taken out of dp_shard); the simulator runs every pp rank
    pp_schedule: str = "1f1b"
    pp_virtual_stages: int = 1
    method: str = "full"  # train.method: lora and qlora train rank-16 adapters on a frozen base
    modules_to_save: tuple[str, ...] = ()  # lora.modules_to_save: modules trained fully beside the adapters
    loss_chunk: int = 0  # parallel.loss_chunk_tokens: the LM head and loss over chunks of this many tokens
    cp: int = 1  # fsdp2: context-parallel degree (taken out of dp_shard)
    every: int = 1  # parallel.checkpoint_every: checkpoint every k-th block only
    offload: bool = False  # parallel.offload_activations: what the blocks save waits in host memory
    objective: str = "sft"  # train.objective: a preference objective's micro-batch holds pairs of rows
    reference: str = "auto"  # parallel.reference (dpo, ipo)

    @property
    def accum(self) -> int:
        return self.plan().grad_accum_steps(self.global_batch)

    @property
    def name(self) -> str:
        dp = f"{self.replicate}x{self.world // self.replicate}" if self.replicate > 1 else f"{self.world}"
        dp += f"-tp{self.tp}" if self.tp > 1 else ""
        dp += "-lp" if self.loss_parallel else ""
        dp += "-sp" if self.sequence_parallel else ""
        dp += f"-pp{self.pp}-{self.pp_schedule}" if self.pp > 1 else ""
        dp += f"x{self.pp_virtual_stages}" if self.pp_virtual_stages > 1 else ""
        reduce = "" if self.backend == "ddp" else f"-{self.grad_reduce}"
        method = "" if self.method == "full" else f"{self.method}-"
        method += "".join(f"{m}-" for m in self.modules_to_save)
        dp += f"-chunk{self.loss_chunk}" if self.loss_chunk else ""
        dp += f"-cp{self.cp}" if self.cp > 1 else ""
        dp += f"-every{self.every}" if self.every > 1 else ""
        dp += ("-offload" if self.offload else "") + (f"-{self.objective}-{self.reference}" if self.objective != "sft" else "")
        return (
            f"{method}{self.arch}-{self.backend}{self.zero_stage}-N{dp}-{self.ac}-mb{self.micro_batch}-L{self.seq_len}-"
            f"B{self.global_batch}-{self.precision}{reduce}"
        )

    def workload(self) -> Workload:
        return Workload(
            seq_len=self.seq_len,
            global_batch_size=self.global_batch,
            mixed_precision=self.precision,
            method=self.method,
            modules_to_save=self.modules_to_save,
            job=job_facts(self.objective),
        )

    def plan(self) -> Plan:
        if self.backend == "ddp":
            replicate, shard = self.world, 1
        else:
            replicate, shard = self.replicate, self.world // (self.replicate * self.tp * self.pp * self.cp)
        reduce = DEFAULT_GRAD_REDUCE["ddp"] if self.backend == "ddp" else self.grad_reduce
        return Plan(
            backend=self.backend,
            zero_stage=self.zero_stage,
            grad_reduce="once_per_step" if self.pp > 1 else reduce,  # what torch's schedules do (config.plan)
            dp_replicate=replicate,
            dp_shard=shard,
            tp=self.tp,
            pp=self.pp,
            pp_schedule=self.pp_schedule,
            pp_virtual_stages=self.pp_virtual_stages,
            activation_checkpointing=self.ac,
            micro_batch_size=self.micro_batch,
            offload_optimizer=False,
            offload_params=False,
            loss_parallel=self.loss_parallel,
            sequence_parallel=self.sequence_parallel,
            loss_chunk_tokens=self.loss_chunk,
            cp=self.cp,
            checkpoint_every=self.every,
            offload_activations=self.offload,
            options=(("reference", self.reference),) if self.objective != "sft" else (),
        )


ONCE = "once_per_step"
MEMORY_CASES = [
    MemoryCase("llama-dense", "fsdp2", 3, 8, "none", 2, 512, 16, "bf16"),
    MemoryCase("llama-dense", "fsdp2", 2, 8, "none", 1, 1024, 16, "bf16"),
    MemoryCase("llama-dense", "fsdp2", 2, 8, "none", 1, 1024, 16, "bf16", ONCE),
    MemoryCase("llama-dense", "ddp", 0, 8, "none", 1, 512, 16, "fp32"),
    MemoryCase("llama-dense", "fsdp2", 3, 64, "full", 4, 512, 512, "bf16"),
    MemoryCase("llama-dense", "fsdp2", 3, 64, "full", 4, 512, 512, "bf16", ONCE),
    MemoryCase("llama-dense", "fsdp2", 3, 8, "none", 1, 512, 32, "bf16", replicate=2),
    MemoryCase("mistral-gqa", "fsdp2", 3, 8, "full", 2, 1024, 32, "bf16"),
    MemoryCase("mistral-gqa", "fsdp2", 3, 8, "full", 2, 1024, 32, "bf16", ONCE),
    MemoryCase("mistral-gqa", "fsdp2", 3, 16, "full", 2, 1024, 64, "bf16", ONCE, replicate=4),
    MemoryCase("mistral-gqa", "ddp", 0, 8, "none", 2, 256, 32, "bf16"),
    MemoryCase("mistral-gqa", "fsdp2", 2, 64, "none", 1, 2048, 64, "fp32"),
    MemoryCase("qwen2-tied", "fsdp2", 3, 8, "none", 4, 256, 32, "fp32"),
    MemoryCase("qwen2-tied", "ddp", 0, 8, "full", 2, 512, 16, "bf16"),
    MemoryCase("qwen2-tied", "fsdp2", 2, 8, "full", 8, 256, 64, "bf16"),
    MemoryCase("qwen2-bigvocab", "fsdp2", 3, 8, "none", 1, 512, 8, "bf16"),
    MemoryCase("qwen2-bigvocab", "ddp", 0, 8, "none", 2, 256, 32, "fp32"),
    MemoryCase("qwen2-bigvocab", "fsdp2", 2, 64, "full", 2, 1024, 128, "bf16"),
    # tensor parallel inside FSDP2 (embeddings, head and logits replicated over tp; no sequence parallel)
    MemoryCase("llama-dense", "fsdp2", 3, 8, "none", 2, 512, 16, "bf16", tp=2),
    MemoryCase("llama-dense", "fsdp2", 3, 8, "none", 2, 512, 16, "bf16", tp=4),
    MemoryCase("mistral-gqa", "fsdp2", 3, 8, "full", 2, 1024, 32, "bf16", ONCE, tp=2),
    MemoryCase("mistral-gqa", "fsdp2", 2, 16, "none", 1, 1024, 32, "fp32", replicate=2, tp=2),
    MemoryCase("qwen2-tied", "fsdp2", 2, 8, "full", 4, 256, 32, "bf16", tp=2),
    MemoryCase("qwen2-bigvocab", "fsdp2", 3, 64, "full", 2, 1024, 128, "bf16", tp=2),
    # ... and with the LM head and the loss sharded over the vocabulary (loss_parallel)
    MemoryCase("qwen2-bigvocab", "fsdp2", 3, 64, "full", 2, 1024, 128, "fp32", tp=2, loss_parallel=True),
    MemoryCase("mistral-gqa", "fsdp2", 2, 8, "none", 2, 1024, 32, "fp32", tp=2, loss_parallel=True),
    MemoryCase("llama-dense", "fsdp2", 3, 8, "none", 2, 512, 16, "fp32", tp=4, loss_parallel=True),
    # ... and with sequence parallelism (norms, residual stream and the embeddings' output on sequence shards)
    MemoryCase("llama-dense", "fsdp2", 3, 8, "none", 2, 512, 16, "bf16", tp=4, sequence_parallel=True),
    MemoryCase("mistral-gqa", "fsdp2", 3, 8, "full", 2, 1024, 32, "bf16", tp=2, sequence_parallel=True),
    MemoryCase("qwen2-tied", "fsdp2", 3, 8, "none", 4, 256, 32, "fp32", tp=2, sequence_parallel=True),
]

# loss_parallel cases run on real tensors (fake ones over-count torch's vocabulary-parallel cross-entropy), so the
# suite's are fp32: on a CPU without AVX-512 a bf16 matmul runs a reference kernel ~160x slower (the first of these
# took over 15 minutes there). The same two plans in bf16, measured by bench/memory_matrix.py only:
BF16_REAL_TENSOR_CASES = [
    MemoryCase("qwen2-bigvocab", "fsdp2", 3, 64, "full", 2, 1024, 128, "bf16", tp=2, loss_parallel=True),
    MemoryCase("llama-dense", "fsdp2", 3, 8, "none", 2, 512, 16, "bf16", tp=4, loss_parallel=True),
]

# Pipelined plans: the simulator runs torch's schedule on every pp rank and reports the busiest (untied models only:
# pipeline stages cannot share a tied head). The first four are asserted by the tests, all by bench/memory_matrix.py.
PIPELINE_MEMORY_CASES = [
    MemoryCase("llama-dense", "fsdp2", 3, 4, "none", 1, 512, 8, "fp32", ONCE, pp=2),
    MemoryCase("mistral-gqa", "fsdp2", 3, 8, "full", 2, 1024, 16, "bf16", ONCE, replicate=2, pp=2),
    MemoryCase("qwen2-bigvocab", "fsdp2", 3, 8, "none", 1, 1024, 16, "bf16", ONCE, pp=2),
    MemoryCase("llama-dense", "fsdp2", 2, 4, "none", 1, 512, 8, "bf16", ONCE, pp=2, pp_schedule="gpipe"),
    MemoryCase("llama-dense", "fsdp2", 3, 8, "none", 1, 512, 16, "bf16", ONCE, pp=4),
    MemoryCase("llama-dense", "fsdp2", 3, 8, "none", 1, 512, 16, "bf16", ONCE, tp=2, pp=2),
    MemoryCase(
        "mistral-gqa",
        "fsdp2",
        3,
        4,
        "none",
        1,
        512,
        8,
        "bf16",
        ONCE,
        pp=2,
        pp_schedule="interleaved_1f1b",
        pp_virtual_stages=2,
    ),
    MemoryCase(
        "llama-dense",
        "fsdp2",
        3,
        4,
        "none",
        1,
        512,
        8,
        "bf16",
        ONCE,
        pp=2,
        pp_schedule="looped_bfs",
        pp_virtual_stages=2,
    ),
]


# Real widths, trimmed depth: (preset of bigtrain/planner/presets.json or a config dict, layers kept)
LLAMA_3_2_1B: dict[str, Any] = dict(  # Llama-3.2-1B's published config.json (architecture fields; tied 128k vocab)
    model_type="llama",
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
LLAMA_3_2_3B: dict[str, Any] = dict(LLAMA_3_2_1B, hidden_size=3072, num_attention_heads=24, num_hidden_layers=28)
REAL_WIDTH_ARCHS: dict[str, tuple[str | dict[str, Any], int]] = {
    "llama-3.2-1b/4L": (LLAMA_3_2_1B, 4),
    "llama-3.2-3b/2L": (LLAMA_3_2_3B, 2),
    "llama-3-8b/2L": ("llama-3-8b", 2),
    "llama-3-8b/4L": ("llama-3-8b", 4),
    "qwen2.5-7b/2L": ("qwen2.5-7b", 2),
    "mistral-7b/2L": ("mistral-7b", 2),
    "mistral-7b/4L": ("mistral-7b", 4),
    "llama-3-70b/2L": ("llama-3-70b", 2),
    # families the planner measures (block_probe.py) instead of its formulas: two dense, two mixtures of experts
    "gemma-2-9b/2L": ("gemma-2-9b", 2),  # eager attention (its L x L scores), four norms per block, 256k vocabulary
    "olmo-2-7b/2L": ("olmo-2-7b", 2),  # norms after attention and MLP, q/k norms over the whole width
    "mixtral-8x7b/2L": ("mixtral-8x7b", 2),  # 8 experts, top-2
    "qwen3-30b-a3b/2L": ("qwen3-30b-a3b", 2),  # 128 narrow experts, top-8
}


def arch_config(arch: str) -> dict[str, Any]:
    """The full HF config of a matrix architecture (``MEMORY_ARCHS`` or ``REAL_WIDTH_ARCHS``)."""
    if arch in MEMORY_ARCHS:
        return load_model_config(MEMORY_ARCHS[arch])
    spec, layers = REAL_WIDTH_ARCHS[arch]
    config = dict(load_model_config(spec))
    config.pop("layer_types", None)  # one entry per layer in some configs (Qwen2): rebuilt for the kept layers
    config["num_hidden_layers"] = layers
    return load_model_config(config)


L1B, L3B, L8B, L8B4, Q7B, M7B, M7B4, L70B, G9B, O7B, MIX, Q30B = REAL_WIDTH_ARCHS
EMBED_AND_HEAD = ("embed_tokens", "lm_head")
REAL_WIDTH_CASES = [
    MemoryCase(L8B, "fsdp2", 3, 8, "none", 1, 2048, 8, "bf16"),
    MemoryCase(L8B, "fsdp2", 3, 16, "full", 2, 2048, 32, "bf16"),  # the held-out configuration
    MemoryCase(L8B, "fsdp2", 2, 64, "full", 1, 8192, 128, "bf16"),
    MemoryCase(L8B, "fsdp2", 2, 64, "full", 1, 8192, 128, "bf16", ONCE),
    MemoryCase(L8B, "fsdp2", 3, 1024, "full", 1, 4096, 2048, "bf16", replicate=8),
    MemoryCase(L8B, "fsdp2", 3, 256, "none", 1, 2048, 512, "bf16", ONCE, replicate=2),
    MemoryCase(L8B, "ddp", 0, 8, "full", 1, 2048, 16, "bf16"),
    MemoryCase(L1B, "ddp", 0, 8, "none", 2, 2048, 32, "bf16"),
    MemoryCase(L1B, "ddp", 0, 16, "none", 1, 4096, 16, "fp32"),
    MemoryCase(L1B, "fsdp2", 2, 8, "none", 4, 2048, 64, "bf16", ONCE),
    MemoryCase(L1B, "fsdp2", 3, 32, "full", 8, 2048, 512, "bf16"),
    MemoryCase(L3B, "fsdp2", 3, 8, "full", 1, 1024, 8, "bf16"),  # tied 128k vocabulary, short sequence
    MemoryCase(L3B, "fsdp2", 2, 16, "none", 2, 2048, 64, "bf16", ONCE),
    MemoryCase(Q7B, "fsdp2", 2, 64, "none", 1, 8192, 128, "bf16"),
    MemoryCase(Q7B, "fsdp2", 3, 16, "full", 2, 4096, 64, "bf16", ONCE),
    MemoryCase(Q7B, "fsdp2", 3, 8, "none", 1, 2048, 8, "fp32"),
    MemoryCase(M7B, "fsdp2", 3, 128, "none", 1, 4096, 256, "bf16", ONCE, replicate=2),
    MemoryCase(M7B, "fsdp2", 2, 32, "full", 4, 2048, 256, "bf16"),
    MemoryCase(M7B4, "fsdp2", 3, 64, "none", 1, 8192, 64, "bf16"),  # the blocks' activations dominate
    MemoryCase(L70B, "fsdp2", 3, 64, "full", 1, 4096, 64, "bf16"),  # wide blocks: a block's backward is the peak
    MemoryCase(L70B, "fsdp2", 3, 128, "full", 1, 2048, 256, "bf16", ONCE),
    MemoryCase(L70B, "fsdp2", 3, 512, "full", 1, 8192, 128, "bf16", tp=8),
    MemoryCase(L8B, "fsdp2", 3, 16, "none", 2, 2048, 32, "bf16", tp=2, sequence_parallel=True),
    MemoryCase(Q7B, "fsdp2", 3, 32, "full", 2, 4096, 64, "bf16", ONCE, tp=4),
    MemoryCase(L8B4, "fsdp2", 3, 16, "none", 1, 2048, 16, "bf16", ONCE, pp=2),
    MemoryCase(M7B4, "fsdp2", 3, 32, "full", 1, 4096, 32, "bf16", ONCE, pp=4, pp_schedule="gpipe"),
    # adapters (train.method lora / qlora, rank 16): a frozen bf16 or NF4 base, fp32 adapters and their AdamW
    MemoryCase(L8B, "fsdp2", 3, 8, "none", 1, 2048, 8, "bf16", method="lora"),
    MemoryCase(L8B, "fsdp2", 3, 16, "full", 2, 2048, 32, "bf16", method="lora"),
    MemoryCase(L8B, "fsdp2", 2, 8, "none", 1, 2048, 16, "bf16", method="lora"),
    MemoryCase(L8B, "fsdp2", 2, 8, "full", 2, 4096, 32, "bf16", ONCE, method="qlora"),
    MemoryCase(L8B, "fsdp2", 3, 8, "none", 1, 4096, 8, "bf16", method="qlora"),
    MemoryCase(L70B, "fsdp2", 3, 16, "full", 1, 2048, 16, "bf16", method="lora"),
    MemoryCase(L70B, "fsdp2", 3, 64, "none", 1, 1024, 64, "bf16", method="lora"),  # the blocks' gathering is the peak
    MemoryCase(L70B, "fsdp2", 3, 64, "full", 1, 4096, 64, "bf16", method="qlora"),
    MemoryCase(Q7B, "fsdp2", 2, 16, "full", 1, 4096, 32, "bf16", method="qlora"),
    MemoryCase(L1B, "ddp", 0, 8, "none", 2, 2048, 32, "bf16", method="lora"),
    MemoryCase(L1B, "ddp", 0, 8, "full", 2, 2048, 32, "bf16", method="qlora"),
    # lora.modules_to_save: the embedding and LM head trained fully beside the adapters (the root unit's reduction)
    MemoryCase(L8B, "fsdp2", 3, 8, "none", 1, 2048, 8, "bf16", method="lora", modules_to_save=EMBED_AND_HEAD),
    MemoryCase(L8B, "fsdp2", 2, 8, "full", 1, 2048, 16, "bf16", method="lora", modules_to_save=EMBED_AND_HEAD),
    MemoryCase(L3B, "fsdp2", 3, 8, "full", 1, 1024, 8, "bf16", method="lora", modules_to_save=("embed_tokens",)),
    MemoryCase(L8B, "fsdp2", 3, 8, "none", 1, 4096, 8, "bf16", method="qlora", modules_to_save=("lm_head",)),
    MemoryCase(L1B, "ddp", 0, 8, "none", 2, 2048, 32, "bf16", method="lora", modules_to_save=("embed_tokens",)),
    # parallel.loss_chunk_tokens: one chunk's logits instead of the micro-batch's (at 152k vocabulary: 28 of 40 GiB)
    MemoryCase(L8B, "fsdp2", 3, 8, "none", 1, 8192, 8, "bf16", loss_chunk=4096),
    MemoryCase(Q7B, "fsdp2", 2, 16, "full", 1, 16384, 16, "bf16", loss_chunk=4096),
    MemoryCase(L3B, "fsdp2", 3, 8, "full", 2, 8192, 16, "bf16", loss_chunk=2048),
    # parallel.cp: each row's sequence split over cp ranks (FSDP2 shards over dp_shard x cp), 32k to 128k tokens
    MemoryCase(L8B, "fsdp2", 3, 8, "full", 1, 32768, 4, "bf16", loss_chunk=4096, cp=2),
    MemoryCase(L8B, "fsdp2", 3, 8, "none", 1, 16384, 2, "bf16", loss_chunk=4096, cp=4),
    MemoryCase(L8B, "fsdp2", 2, 8, "full", 1, 65536, 1, "bf16", loss_chunk=4096, cp=8),
    MemoryCase(L8B, "fsdp2", 3, 8, "full", 1, 131072, 1, "bf16", loss_chunk=4096, cp=8),
    # selective (per-op) checkpointing, and full checkpointing of every other block
    MemoryCase(L8B4, "fsdp2", 3, 8, "selective", 1, 8192, 8, "bf16", loss_chunk=4096),
    MemoryCase(L8B4, "fsdp2", 3, 8, "full", 1, 8192, 8, "bf16", loss_chunk=4096, every=2),
    MemoryCase(Q7B, "fsdp2", 2, 16, "selective", 1, 4096, 32, "bf16", ONCE),
    MemoryCase(M7B4, "fsdp2", 3, 16, "selective", 1, 16384, 16, "bf16", loss_chunk=4096, cp=2, every=2),
    # parallel.offload_activations: all the blocks save, or their checkpointed inputs, wait in host memory
    MemoryCase(L8B4, "fsdp2", 3, 8, "none", 1, 16384, 8, "bf16", loss_chunk=4096, offload=True),
    MemoryCase(L8B, "fsdp2", 3, 8, "full", 1, 65536, 2, "bf16", loss_chunk=4096, cp=4, offload=True),
    MemoryCase(L8B, "fsdp2", 3, 8, "full", 1, 32768, 8, "bf16", loss_chunk=4096, method="lora", offload=True),
    MemoryCase(L1B, "ddp", 0, 8, "full", 1, 32768, 8, "bf16", loss_chunk=4096, every=2, offload=True),
    MemoryCase(Q7B, "fsdp2", 2, 8, "none", 1, 32768, 8, "bf16", loss_chunk=4096, cp=2, offload=True),
    # measured families
    MemoryCase(G9B, "fsdp2", 3, 8, "none", 1, 2048, 8, "bf16"),
    MemoryCase(G9B, "fsdp2", 2, 16, "full", 2, 4096, 32, "bf16", ONCE),
    MemoryCase(O7B, "fsdp2", 3, 8, "none", 2, 2048, 16, "bf16"),
    MemoryCase(O7B, "fsdp2", 3, 32, "full", 1, 8192, 64, "bf16", ONCE),
    MemoryCase(MIX, "fsdp2", 3, 8, "none", 1, 4096, 8, "bf16"),
    MemoryCase(MIX, "fsdp2", 3, 64, "full", 2, 2048, 128, "bf16"),
    MemoryCase(Q30B, "fsdp2", 3, 8, "none", 2, 2048, 16, "bf16"),
    MemoryCase(Q30B, "fsdp2", 2, 16, "full", 1, 8192, 32, "bf16", ONCE),
]
