"""LoRA and QLoRA (``train.method``): peft's adapters injected into the model on meta, everything else frozen.

- **Where in the order**: first, before anything slices, wraps or shards the model, so that each adapter lives in
  the same block (the same FSDP2 unit) as the linear it adapts, and activation checkpointing and compile see it.
- **Injection**: ``peft.inject_adapter_in_model`` on the meta model (no memory); peft freezes every parameter that
  is not an adapter, and the frozen base is kept in the compute dtype (bf16: 2 bytes per parameter, no fp32 master
  copy, since it is never updated). The adapted linear's weight is then named ``….q_proj.base_layer.weight``:
  ``rename`` maps it back to its HF name (``….q_proj.weight``), so the base's values load from the HF checkpoint as
  they would without adapters, and adapters are named ``….q_proj.lora_A.weight`` (peft's file keys, without the
  adapter name).
- **Values** (``fill_values``, after the base's values are loaded): each adapter starts as peft's default (``lora_A``
  Kaiming-uniform, ``lora_B`` zero, so training starts from the base model) drawn from a generator seeded by
  ``train.seed`` and the adapter's name: the same initial adapters for every plan, made one module at a time.
- **QLoRA**: each adapted linear's weight becomes torchao's 4-bit NF4 tensor (blocks of 64 values with one scale
  each, the scales themselves quantised), frozen, still on meta: FSDP2 shards it as it is, and loading the values
  quantises each weight as it is copied in; its forward dequantises to bf16.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from bigtrain.config.hf import decoder_blocks, is_linear, linear_names, names_module
from bigtrain.config.model_parts import has_parts, language_model_block_linears, language_model_linears
from bigtrain.config.schema import ADAPTER_METHODS, AdapterConfig
from bigtrain.errors import ConfigError
from bigtrain.models.build import build_meta_model
from bigtrain.models.materialize import write_full
from bigtrain.parallel.precision import COMPUTE_DTYPES
from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform

ADAPTER_NAME = "default"  # peft's name for the one adapter; dropped from every key we write
NF4_BLOCK = 64  # values per NF4 scale (torchao's default, QLoRA's paper)
NF4_SCALER_BLOCK = 256  # scales per second-level scale


def target_modules(model: nn.Module, lora: AdapterConfig) -> list[str] | str:
    """The names handed to peft: the recipe's (each must name a linear module of the model, else one line listing
    what would), or every linear of the decoder blocks; of a vision-language model, its language model's blocks
    (a regular expression: its vision blocks have linears of the same names)."""
    inside, outside = linear_names(model)
    if lora.target_modules is None:
        if has_parts(model.config):  # a vision-language model: its language model's blocks
            return language_model_linears(model, language_model_block_linears(model))
        if not inside:
            raise ConfigError(
                f"train.method=lora: {type(model).__name__} has no linear layer in its blocks (a CNN's are "
                "convolutions), and LoRA here adapts linears; train it with train.method=full"
            )
        return inside
    linears = [name for name, m in model.named_modules() if is_linear(m)]
    by_name = []  # whether each target names modules by their ending (peft's rule for a list), else by expression
    for target in lora.target_modules:
        by_name.append(any(names_module(target, n) for n in linears))
        if not by_name[-1] and not any(re.fullmatch(target, n) for n in linears):
            raise ConfigError(
                f"lora.target_modules: {target!r} names no linear module of this model; its linear modules are "
                f"{', '.join(inside)} (in every decoder block) and {', '.join(outside) or 'none'} (outside)"
            )
    if all(by_name):
        return list(lora.target_modules)
    # peft reads a list as endings only: a regular expression among them goes with the names into one expression
    targets = zip(lora.target_modules, by_name, strict=True)
    parts = [rf"(?:.*\.)?{re.escape(t)}" if named else f"(?:{t})" for t, named in targets]
    return "|".join(parts)


def is_target(name: str, targets: list[str] | str) -> bool:
    """Whether peft adapts the module ``name``: a regular expression matches it whole; a list names its ending."""
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(names_module(t, name) for t in targets)


def modules_trained_fully(model: nn.Module, lora: AdapterConfig, targets: list[str] | str) -> list[str]:
    """The names of the modules ``lora.modules_to_save`` selects in ``model`` (before injection), by peft's rule for
    that list (the module's name ends with the entry), so that peft selects the same ones when it loads the adapter.
    An entry naming nothing, or a module that is or holds an adapted linear, is one line saying what would work."""
    if not lora.modules_to_save:
        return []
    names = [name for name, _ in model.named_modules() if name]
    adapted = [n for n, m in model.named_modules() if is_linear(m) and is_target(n, targets)]
    chosen: list[str] = []
    for entry in lora.modules_to_save:
        hits = [n for n in names if n.endswith(entry)]
        if not hits:
            in_blocks = {id(m) for _, _, block in decoder_blocks(model) for m in block.modules()}
            inside, outside = set(), set()
            for name, module in model.named_modules():
                if id(module) in in_blocks:
                    inside |= {name.rsplit(".", 1)[-1]} if name.rsplit(".", 1)[-1].isidentifier() else set()
                elif any(True for _ in module.parameters(recurse=False)):
                    outside.add(name.rsplit(".", 1)[-1])
            raise ConfigError(
                f"lora.modules_to_save: {entry!r} names no module of this model; outside the decoder blocks it has "
                f"{', '.join(sorted(outside))}; in every block {', '.join(sorted(inside))}"
            )
        for hit in hits:
            held = [a for a in adapted if a == hit or a.startswith(hit + ".")]
            if held:
                raise ConfigError(
                    f"lora.modules_to_save: {entry!r} selects {hit}, which {'is' if held == [hit] else 'holds'} an "
                    f"adapted linear ({held[0]}); a module trains either fully or through adapters: name another, or "
                    "leave it out of lora.target_modules"
                )
        chosen += [hit for hit in hits if hit not in chosen]
    return chosen


def peft_config(
    lora: AdapterConfig,
    targets: list[str] | str,
    tied: bool = False,
    with_modules_to_save: bool = True,
    task_type: str | None = "CAUSAL_LM",
):  # -> peft.LoraConfig (imported lazily: peft is heavy)
    """peft's config for these adapters (what the saved adapter folder holds). ``tied``: a module trained fully
    shares its weight with another (a tied embedding and LM head), which peft keeps shared on load only when asked
    (ensure_weight_tying). ``with_modules_to_save=False``: the config we inject with (module docstring)."""
    from peft import LoraConfig

    modules_to_save = list(lora.modules_to_save) if lora.modules_to_save and with_modules_to_save else None
    # task_type: PeftModel.from_pretrained then gives e.g. a PeftModelForCausalLM (generate, labels) for the adapter
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        modules_to_save=modules_to_save,
        ensure_weight_tying=tied and modules_to_save is not None,
        bias="none",
        task_type=task_type,
    )


def inject_adapters(model: nn.Module, lora: AdapterConfig) -> None:
    """peft's adapters injected into ``model`` (on meta: no memory), every other parameter frozen but those of
    ``lora.modules_to_save``. peft's own wrapper for those is not used: it keeps a frozen original beside a trained
    copy (twice the memory) and renames the weight; unfreezing the module in place trains the same values, and a
    tied embedding's one weight trains for both its uses, as peft's ensure_weight_tying does."""
    from peft import inject_adapter_in_model

    targets = target_modules(model, lora)
    fully = modules_trained_fully(model, lora, targets)
    config = peft_config(lora, targets, with_modules_to_save=False)
    inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    for name in fully:
        model.get_submodule(name).requires_grad_(True)


def _inject(built: BuiltModel, ctx: BuildContext) -> None:
    lora = ctx.options.lora
    base_dtype = COMPUTE_DTYPES[ctx.options.mixed_precision]  # None: fp32
    for part in built.parts:
        inject_adapters(part, lora)
        if base_dtype is not None:
            # the frozen base is stored in the compute dtype (half of fp32's bytes): it is never updated, so it
            # needs no fp32 master copy; the adapters keep fp32 weights for AdamW. On meta: nothing is allocated.
            for param in part.parameters():
                if not param.requires_grad:
                    param.data = param.data.to(base_dtype)
        if ctx.options.method == "qlora":
            # NF4 on meta too: FSDP2 shards the 4-bit tensor (torchao implements its all-gather), and loading the
            # values copies each full weight into it, which quantises it (NF4Tensor.copy_ of a plain tensor)
            shards = ctx.mesh.degree("dp_shard") * ctx.mesh.degree("cp") if ctx.options.plan.backend == "fsdp2" else 1
            for _, layer in adapted_linears(part):
                quantize_base(layer.get_base_layer(), shards)
            built.convert_value = whole_nf4


def trained_shapes(hf_config: Any, attn_implementation: str, lora: AdapterConfig) -> dict[str, tuple[int, ...]]:
    """What an adapter run's checkpoint holds of the model, by name and shape: the adapters and the persistent
    buffers (the frozen base is not state)."""
    model = build_meta_model(hf_config, attn_implementation)
    inject_adapters(model, lora)
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    return {hf_name(n): tuple(t.shape) for n, t in model.state_dict().items() if n not in frozen}


def adapted_linears(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, peft LoRA layer) of every adapted linear, in module order."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def initial_lora_A(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """peft's default initial ``lora_A`` (Kaiming-uniform with a=sqrt(5), nn.Linear's rule) for the adapter named
    ``name``, from a generator of its own: the value does not depend on which other adapters a rank holds."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return nn.init.kaiming_uniform_(torch.empty(shape), a=math.sqrt(5), generator=generator)


def _nf4_local(param: torch.Tensor) -> Any:
    """The NF4 tensor behind a parameter (FSDP2's DTensor holds this rank's shard), or None."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor

    local = param._local_tensor if isinstance(param, DTensor) else param
    return local if isinstance(local, NF4Tensor) else None


def whole_nf4(target: torch.Tensor, full: torch.Tensor) -> torch.Tensor | None:
    """The NF4 quantisation of a whole weight with ``target``'s blocks (None: ``target`` is not NF4): quantised
    whole, then sharded, so every shard shares the whole tensor's scale mean as a single-device run has it."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor, to_nf4

    if not isinstance(target, NF4Tensor):
        return None
    value = full.to(device=target.quantized_data.device, dtype=torch.bfloat16).contiguous()
    return to_nf4(value, target.block_size, target.scaler_block_size)


def _allocate_nf4_tables(built: BuiltModel, ctx: BuildContext) -> None:
    """An NF4 tensor made on meta keeps its 16-value code table and its scale mean on meta through allocation
    (torchao's empty_like allocates only the sharded parts): allocate them on the tensor's device, before the
    values are copied in (the copy fills both)."""
    for part in built.parts:
        for param in part.parameters():
            local = _nf4_local(param)
            if local is None:
                continue
            device = local.quantized_data.device
            for name in ("nf4", "scaler_mean"):
                if getattr(local, name).is_meta:
                    setattr(local, name, torch.empty_like(getattr(local, name), device=device))


@torch.no_grad()
def _fill(built: BuiltModel, ctx: BuildContext) -> None:
    options = ctx.options
    if options.values == "load":
        for part in built.parts:
            for name, tensor in part.named_parameters():
                hf = built.hf_name(name)
                if ".lora_A." in hf:
                    write_full(tensor, initial_lora_A(hf, tuple(tensor.shape), options.seed), hf, "LoRA's init")
                elif ".lora_B." in hf:
                    write_full(tensor, torch.zeros(tuple(tensor.shape)), hf, "LoRA's init")


def nf4_scaler_block(numel: int, shards: int = 1) -> int:
    """torchao's second-level block (256 scales) where the weight's scales split into a multiple of ``shards`` such
    blocks (FSDP2 splits each of the NF4 tensor's parts over the shards), else the largest power of two that does.
    Real widths take 256 whatever the shards (a 4096 x 4096 weight has 1024 such blocks); only small test models
    get a smaller block, whose NF4 values then depend on the shard count."""
    scales = numel // NF4_BLOCK
    block = NF4_SCALER_BLOCK
    while block > 1 and scales % (block * shards):
        block //= 2
    return block


def base_nf4(weight: torch.Tensor, shards: int = 1) -> Any:
    """``weight`` as QLoRA stores it: an NF4 tensor of its bf16 values (QLoRA's compute dtype), blocks as
    ``nf4_scaler_block`` says for ``shards``, on the weight's device (meta: shapes only)."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    return to_nf4(weight.detach().to(torch.bfloat16), NF4_BLOCK, nf4_scaler_block(weight.numel(), shards))


def quantize_base(linear: nn.Module, shards: int = 1) -> None:
    """The frozen weight of ``linear`` replaced by ``base_nf4`` of it."""
    weight = linear.weight
    rows = weight.shape[0]
    if weight.numel() % NF4_BLOCK or rows % shards or (weight.numel() // shards) % NF4_BLOCK:
        raise ConfigError(
            f"train.method=qlora: a weight of shape {tuple(weight.shape)} does not split into NF4 blocks of "
            f"{NF4_BLOCK} values on each of {shards} shard(s); use lora for this model, or fewer dp_shard ranks"
        )
    linear.weight = nn.Parameter(base_nf4(weight, shards), requires_grad=False)


def dequantized_as_trained(weight: torch.Tensor) -> torch.Tensor:
    """The values QLoRA trained against for a base weight: its NF4 quantisation, dequantised (fp32)."""
    return base_nf4(weight).get_original_weight().float()


_PEFT_PARTS = re.compile(rf"\.base_layer(?=\.)|(?<=\.lora_[AB])\.{ADAPTER_NAME}(?=\.)")


def hf_name(name: str) -> str:
    """``….q_proj.base_layer.weight`` -> ``….q_proj.weight``; ``….lora_A.default.weight`` -> ``….lora_A.weight``."""
    return _PEFT_PARTS.sub("", name)


TRANSFORM = Transform(
    name="adapters",
    wanted=lambda options: options.method in ADAPTER_METHODS,
    apply=_inject,
    rename=hf_name,
    on_allocated=_allocate_nf4_tables,
    fill_values=_fill,
    planner_terms=(
        "adapter_memory.estimate_adapter_memory",
        "adapter_memory.adapter_flops_per_token",
        "cost.estimate_time",
    ),
)
