"""What the planner needs of a family it has no formulas for, measured on the model itself.

Parameters come from the model built on the meta device (no memory): per decoder block, what its attention, its
MLP (or mixture of experts) and its norms hold, what lies outside the blocks, and for a mixture of experts the
expert weights apart, so that total and active parameters can differ.

Activations and FLOPs come from running one block of each kind the model has (a block differs from another by its
class, its attention type or its parameters' shapes: Gemma 2 alternates sliding and global attention, DeepSeek-V3
starts with dense blocks before its MoE ones) on fake tensors, which hold shapes and no values, so even a 70B-wide
block runs in a fraction of a second. Autograd's saved-tensor hooks see every tensor the block keeps for backward;
each storage counts once, the weights and what the block is handed from outside (RoPE's cos and sin, the mask:
shared by every block) not at all. What is kept is sorted by what tensor parallelism does with it:
- ``norm_own``: saved inside the block's own norms (their fp32 input, statistics, normalised input): whole on every
  tp rank, split over them by sequence parallelism;
- ``replicated``: a norm's output saved by the projections that read it: whole on every tp rank (the all-gathered
  input under sequence parallelism);
- ``split``: everything between a column-wise and a row-wise projection (heads, MLP units, experts): 1/tp each.
Two row lengths separate the bytes per token from the bytes per token that grow with the row (eager attention's
L x L scores), and likewise FLOPs (attention's QK^T and PV). torch's FLOP counter counts the matmuls; the CPU
attention kernel and the grouped matmul of transformers' experts are counted here with the usual 2·m·n·k rule.

A mixture of experts routes by values, which fake tensors do not have. transformers' default experts kernel
(``grouped_mm``) sorts the k·T (token, expert) pairs by expert and multiplies them in one grouped matmul, so what
it saves and computes depends on k·T alone, not on which expert each token picks: the measurement is the routing's,
whatever it is. What the routing changes is the spread over experts (``tokens_per_expert`` assumes the uniform
spread a load-balancing loss aims at) and, under expert parallelism, how many tokens a rank receives.

The Llama, Mistral and Qwen2 formulas of ``memory_terms.py`` and ``cost.py`` give the same numbers, byte for byte
and FLOP for FLOP (``tests/unit/test_block_probe.py``), which is why those families keep their formulas.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from unittest import mock

SHORT, LONG = 64, 128  # the two row lengths measured (fake tensors: the length costs nothing)


@dataclass(frozen=True)
class SavedBytes:
    """Bytes one block keeps for backward per token, for one compute dtype (module docstring)."""

    norm_own: float
    replicated: float
    split: float
    split_per_len: float  # per token and per token of the row

    def at(self, tp: int = 1, sequence_parallel: bool = False, seq_len: int = 0) -> float:
        norms = self.norm_own / (tp if sequence_parallel else 1)
        return norms + self.replicated + (self.split + self.split_per_len * seq_len) / tp


@dataclass(frozen=True)
class BlockCounts:
    """Parameters of one decoder block, averaged over the model's blocks (kinds may differ)."""

    params: float
    attn: float
    mlp: float  # MLP or mixture: router, shared experts and every expert
    norms: float
    experts: float  # the routed experts' weights (0 for a dense block)
    active: float  # what one token goes through: all but the experts, plus top_k/num_experts of them
    linears: float  # nn.Linear modules (what LoRA adapts by default)
    linear_in_out: float  # the sum of in + out features over them (LoRA's r·(in + out))
    routed: float  # 1 for a block with routed experts (averaged: the share of such blocks)


@dataclass(frozen=True)
class ModelProfile:
    """Everything ``ModelStats`` takes from a measured model."""

    block: BlockCounts
    embed: int  # the input embedding (and learned positions)
    head: int  # the LM head's own weight (0 when tied to the embedding)
    final_norm: int  # everything else outside the blocks
    num_experts: int
    top_k: int
    expert_ffn: int  # one expert's inner width
    saved: tuple[SavedBytes, SavedBytes]  # in bf16 (or fp16) and in fp32 compute
    flops: float  # forward FLOPs per token of one block (averaged over kinds)
    flops_per_len: float  # forward FLOPs per token and per token of the row

    def saved_bytes(self, a: int) -> SavedBytes:
        """For a compute dtype of ``a`` bytes (fp8 matmuls keep bf16 activations)."""
        return self.saved[1 if a == 4 else 0]


def profile_model(hf_config: Any, attn_implementation: str) -> ModelProfile:
    """Measure ``hf_config``'s model (cached per config and attention kernel)."""
    return _profile(json.dumps(hf_config.to_dict(), sort_keys=True, default=str), attn_implementation)


@lru_cache(maxsize=32)
def _profile(config_json: str, attn_implementation: str) -> ModelProfile:
    import torch
    from transformers import AutoConfig

    fields = json.loads(config_json)
    hf_config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    model = _meta_model(hf_config, attn_implementation, torch.float32)
    blocks = list(_layers(model))
    kinds: dict[Any, list[int]] = {}
    for i, block in enumerate(blocks):
        kinds.setdefault(_kind(block), []).append(i)
    share = [len(idx) / len(blocks) for idx in kinds.values()]  # of the blocks that are of each kind
    firsts = [idx[0] for idx in kinds.values()]
    block = _mean(BlockCounts, share, [_count_block(blocks[i], hf_config) for i in firsts])

    embedding = model.get_input_embeddings()
    head_module = model.get_output_embeddings()
    tied = head_module is not None and head_module.weight is embedding.weight
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    embed = embedding.weight.numel()
    head = 0 if tied or head_module is None else head_module.weight.numel()
    in_blocks = sum(p.numel() for b in blocks for p in b.parameters())
    experts = [m for b in blocks for m in _experts_modules(b)]

    saved = []
    for dtype in (torch.bfloat16, torch.float32):
        short, long = _measure(hf_config, attn_implementation, dtype, firsts, (SHORT, LONG))
        per_kind = [_fit(s, lg) for s, lg in zip(short, long, strict=True)]
        saved.append(_mean(SavedBytes, share, [k[0] for k in per_kind]))
    # FLOPs do not depend on the dtype: the last (fp32) measurement's
    flops = sum(w * k[1] for w, k in zip(share, per_kind, strict=True))
    flops_per_len = sum(w * k[2] for w, k in zip(share, per_kind, strict=True))
    return ModelProfile(
        block=block,
        embed=embed,
        head=head,
        final_norm=total - in_blocks - embed - head,
        num_experts=int(getattr(experts[0], "num_experts", 0)) if experts else 0,
        top_k=int(getattr(hf_config, "num_experts_per_tok", 0) or 0) if experts else 0,
        expert_ffn=_expert_ffn(experts[0], hf_config.hidden_size) if experts else 0,
        saved=(saved[0], saved[1]),
        flops=flops,
        flops_per_len=flops_per_len,
    )


def _mean(cls: Any, share: list[float], items: list[Any]) -> Any:
    """The ``cls`` whose every field is the mean of ``items``' weighted by ``share``."""
    fields = cls.__dataclass_fields__
    return cls(*(sum(w * getattr(item, f) for w, item in zip(share, items, strict=True)) for f in fields))


# ---- the meta model and its parameters ----------------------------------------------------------------------------


def _meta_model(hf_config: Any, attn_implementation: str, dtype: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config, attn_implementation=attn_implementation, dtype=dtype)


def _layers(model: Any) -> Any:
    from bigtrain.config.hf import decoder_blocks

    return [block for _, _, block in decoder_blocks(model)]  # (the block list, its index, the block)


def _kind(block: Any) -> tuple[Any, ...]:
    shapes = tuple((name, tuple(p.shape)) for name, p in block.named_parameters())
    return type(block).__name__, getattr(block, "attention_type", None), shapes


def _experts_modules(block: Any) -> list[Any]:
    """The routed experts of a block: transformers names the module holding them ``experts``."""
    return [m for name, m in block.named_modules() if name.split(".")[-1] == "experts"]


def _expert_ffn(experts: Any, hidden: int) -> int:
    """One expert's inner width: the dimension of its down projection that is not the hidden size."""
    down = getattr(experts, "down_proj", None)
    if down is None or down.dim() != 3:
        return 0
    inner = [d for d in down.shape[1:] if d != hidden]
    return int(inner[0]) if inner else hidden


def _norms(block: Any) -> list[Any]:
    """The block's own norms: its direct children whose class is a norm."""
    return [m for m in block.children() if "norm" in type(m).__name__.lower()]


def _count_block(block: Any, hf_config: Any) -> BlockCounts:
    from torch import nn

    params = sum(p.numel() for p in block.parameters())
    norms = sum(p.numel() for m in _norms(block) for p in m.parameters())
    own_norms = set(map(id, _norms(block)))  # (post_attention_layernorm names attention too)
    attn_modules = [
        m for name, m in block.named_children() if ("attn" in name or "attention" in name) and id(m) not in own_norms
    ]
    attn = sum(p.numel() for m in attn_modules for p in m.parameters())
    experts = sum(p.numel() for m in _experts_modules(block) for p in m.parameters())
    active = params - experts
    if experts:
        num = getattr(_experts_modules(block)[0], "num_experts", 0) or 1
        active += experts * getattr(hf_config, "num_experts_per_tok", 1) / num
    linears = [m for m in block.modules() if isinstance(m, nn.Linear)]
    return BlockCounts(
        params=params,
        attn=attn,
        mlp=params - attn - norms,
        norms=norms,
        experts=experts,
        active=active,
        linears=len(linears),
        linear_in_out=sum(m.in_features + m.out_features for m in linears),
        routed=1.0 if experts else 0.0,
    )


# ---- one forward on fake tensors ----------------------------------------------------------------------------------


@dataclass
class _Seen:
    norm_own: int = 0
    replicated: int = 0
    split: int = 0
    flops: int = 0


def _fit(short: _Seen, long: _Seen) -> tuple[SavedBytes, float, float]:
    """Per token (b) and per token and row token (c) from totals at two lengths: total = b·L + c·L²."""

    def solve(s: float, lg: float) -> tuple[float, float]:
        c = (lg / LONG - s / SHORT) / (LONG - SHORT)
        c = max(c, 0.0)
        return s / SHORT - c * SHORT, c

    norm_own, _ = solve(short.norm_own, long.norm_own)
    replicated, _ = solve(short.replicated, long.replicated)
    split, split_per_len = solve(short.split, long.split)
    flops, flops_per_len = solve(short.flops, long.flops)
    return SavedBytes(round(norm_own), round(replicated), round(split), split_per_len), flops, flops_per_len


def _measure(
    hf_config: Any, attn_implementation: str, dtype: Any, keep: list[int], lengths: tuple[int, ...]
) -> list[list[_Seen]]:
    """One forward per row length of the model cut down to the ``keep`` blocks, all on one fake-tensor model: per
    length, a tally per kept block."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    model = _meta_model(hf_config, attn_implementation, dtype)
    blocks = _layers(model)
    chosen = [blocks[i] for i in keep]
    _keep_blocks(model, chosen)
    per_length = []
    with FakeTensorMode(allow_non_fake_inputs=True), _fp32_experts(dtype):
        model.to_empty(device="cpu")
        weights = {p.untyped_storage()._cdata for p in model.parameters()}
        names = {id(m): n for n, m in model.named_modules()}
        for seq_len in lengths:
            seen = [_Seen() for _ in chosen]
            counter = FlopCounterMode(display=False, custom_mapping=cpu_flop_formulas())
            with contextlib.ExitStack() as hooks:
                for block, tally in zip(chosen, seen, strict=True):
                    hooks.enter_context(_watch(block, tally, weights))
                with counter:
                    model(input_ids=torch.zeros((1, seq_len), dtype=torch.long))
            by_module = counter.get_flop_counts()
            for block, tally in zip(chosen, seen, strict=True):
                key = next((k for k in by_module if k.endswith(names[id(block)])), None)
                tally.flops = sum(by_module[key].values()) if key else 0
            per_length.append(seen)
    return per_length


def _keep_blocks(model: Any, chosen: list[Any]) -> None:
    """Leave only ``chosen`` in the model's block list (each keeps its own index and attention type)."""
    from torch import nn

    from bigtrain.config.hf import decoder_blocks

    block_list = decoder_blocks(model)[0][0]
    for owner in list(model.modules()):
        for attr, child in owner.named_children():
            if child is block_list:
                setattr(owner, attr, nn.ModuleList(chosen))


@contextlib.contextmanager
def _watch(block: Any, tally: _Seen, weights: set[int]) -> Iterator[None]:
    """Sort what ``block`` saves for backward into ``tally`` (module docstring)."""
    import torch

    stack: list[Any] = []
    outside: set[int] = set()  # storages handed in besides the hidden states: shared by every block
    norm_outputs: set[int] = set()
    counted: set[int] = set()
    norms = set(map(id, _norms(block)))
    # every tensor whose storage is recorded by its address, kept alive while the block runs: a storage freed and
    # another allocated at its address would otherwise be taken for it (a norm's output, freed after its use, and
    # a later tensor of the block at the same address: what made DeepSeek-V3's measurement vary from run to run)
    alive: list[Any] = []

    def storages(obj: Any) -> Iterator[int]:
        if isinstance(obj, torch.Tensor):
            alive.append(obj)
            yield obj.untyped_storage()._cdata
        elif isinstance(obj, (tuple, list)):
            for item in obj:
                yield from storages(item)
        elif isinstance(obj, dict):
            for item in obj.values():
                yield from storages(item)

    def block_pre(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        outside.update(storages(args[1:]))
        outside.update(storages(kwargs))
        if args:
            outside.discard(args[0].untyped_storage()._cdata)

    def enter(module: Any, args: Any) -> None:
        stack.append(module)

    def leave(module: Any, args: Any, output: Any) -> None:
        stack.pop()
        if id(module) in norms:
            norm_outputs.update(storages(output))

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not stack:
            return t
        key = t.untyped_storage()._cdata
        if key in weights or key in outside or key in counted:
            return t
        counted.add(key)
        alive.append(t)
        nbytes = t.untyped_storage().nbytes()
        inner = next((m for m in reversed(stack) if id(m) in norms), None)
        if inner is not None:
            tally.norm_own += nbytes
        elif key in norm_outputs:
            tally.replicated += nbytes
        else:
            tally.split += nbytes
        return t

    handles = [block.register_forward_pre_hook(block_pre, with_kwargs=True)]
    for module in block.modules():
        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _fp32_experts(dtype: Any) -> Iterator[None]:
    """torch's grouped matmul takes bf16 only on the fake (CUDA-like) path; for fp32 measure through transformers'
    own fallback operator, which saves the same tensors."""
    import torch

    if dtype == torch.bfloat16:
        yield
        return
    try:
        import transformers.integrations.moe as moe
    except ImportError:
        yield
        return
    with mock.patch.object(moe, "_can_use_grouped_mm", return_value=False):
        yield


def cpu_flop_formulas() -> dict[Any, Any]:
    """FLOPs of the kernels torch's counter does not know on the CPU: attention, grouped matmuls (2·m·n·k)."""
    import torch

    def attention(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
        b, h, s_q, d = query_shape
        s_k, d_v = key_shape[-2], value_shape[-1]
        return 2 * b * h * s_q * s_k * d + 2 * b * h * s_q * s_k * d_v

    def grouped(a_shape: Any, b_shape: Any, *args: Any, **kwargs: Any) -> int:
        return 2 * a_shape[0] * a_shape[1] * b_shape[-1]

    formulas = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: attention}
    formulas[torch.ops.aten._grouped_mm] = grouped
    with contextlib.suppress(AttributeError, RuntimeError):
        formulas[torch.ops.transformers.grouped_mm_fallback] = grouped
    return formulas
