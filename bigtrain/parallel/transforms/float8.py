"""``train.fp8``: the decoder blocks' linear layers compute their matmuls in FP8, with torchao's float8 training.

Each chosen ``nn.Linear`` becomes torchao's ``Float8Linear``: in forward and backward its input, weight and output
gradient are cast to float8 (e4m3 forward, e5m2 gradients) with dynamic scales, one per tensor (``tensorwise``) or
one per row (``rowwise``), and multiplied by ``torch._scaled_mm``; everything else stays in the compute dtype. On a
device without FP8 tensor cores (the CPU) torchao emulates the casts and the scaled matmul, with the same rounding:
that is how the suite checks it (``tests/distributed/test_fp8.py``).

Which linears stay in the compute dtype, by rule (torchtitan's filter, written down):
- the LM head (the logits feed the loss directly; the first layer is an embedding, not a matmul);
- a mixture's router (the linear beside an ``experts`` module: routing decisions flip on small errors);
- any linear whose input or output width is not a multiple of 16 (what the FP8 GEMM requires).

Applied on the meta model before activation checkpointing, compile and FSDP2 (torchtitan's order), so they wrap and
shard the float8 linears. Under FSDP2 on CUDA with tensorwise scaling the weights are all-gathered in FP8
(``enable_fsdp_float8_all_gather``: half the bytes of bf16), which needs every weight's scale computed once after
each optimizer step for all of them together (``precompute_float8_dynamic_scale_for_fsdp``, the ``after_step``
hook). Elsewhere (CPU, gloo, rowwise) the gather stays in the compute dtype.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from bigtrain.errors import ConfigError
from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform

FP8_ALIGNMENT = 16  # torch._scaled_mm needs both matrix dimensions to be multiples of 16


def keeps_precision(module: nn.Module, name: str, routers: set[int]) -> bool:
    """Whether the linear ``name`` stays in the compute dtype (the module docstring's rule)."""
    if not isinstance(module, nn.Linear) or id(module) in routers:
        return True
    if name.split(".")[-1] == "lm_head":
        return True
    return module.in_features % FP8_ALIGNMENT != 0 or module.out_features % FP8_ALIGNMENT != 0


def _routers(model: nn.Module) -> set[int]:
    """The linears that sit beside a mixture's ``experts`` module (its router)."""
    found = set()
    for module in model.modules():
        children = dict(module.named_children())
        if "experts" in children:
            found |= {id(child) for child in children.values() if isinstance(child, nn.Linear)}
    return found


def _gathers_in_fp8(ctx: BuildContext) -> bool:
    options = ctx.options
    return options.plan.backend == "fsdp2" and options.fp8 == "tensorwise" and options.device.type == "cuda"


def apply_float8(model: nn.Module, recipe: str, emulate: bool, fp8_all_gather: bool) -> int:
    """Convert ``model``'s chosen linears in place; returns how many were converted."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    config = dataclasses.replace(config, emulate=emulate, enable_fsdp_float8_all_gather=fp8_all_gather)
    routers = _routers(model)
    before = sum(isinstance(m, nn.Linear) for m in model.modules())
    convert_to_float8_training(
        model, config=config, module_filter_fn=lambda module, name: not keeps_precision(module, name, routers)
    )
    return before - sum(type(m) is nn.Linear for m in model.modules())


def _convert(built: BuiltModel, ctx: BuildContext) -> None:
    device = ctx.options.device
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise ConfigError(
            f"train.fp8={ctx.options.fp8} needs FP8 tensor cores (compute capability 8.9 or later: H100, H200, B200, "
            f"L40S, L4, RTX 4090); {name} has none; set train.fp8=none"
        )
    emulate = device.type != "cuda"
    converted = sum(apply_float8(part, ctx.options.fp8, emulate, _gathers_in_fp8(ctx)) for part in built.parts)
    if not converted:
        raise ConfigError(
            f"train.fp8={ctx.options.fp8} converts nn.Linear layers of the decoder blocks, and this model has none "
            "that qualify (GPT-2's blocks use Conv1D; fused expert weights are not linears); set train.fp8=none"
        )
    built.fp8_all_gather = _gathers_in_fp8(ctx)


def _precompute_scales(built: BuiltModel) -> None:
    if built.fp8_all_gather:
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        for part in built.parts:
            precompute_float8_dynamic_scale_for_fsdp(part)


TRANSFORM = Transform(
    name="float8",
    wanted=lambda options: options.fp8 != "none",
    apply=_convert,
    after_step=_precompute_scales,
    planner_terms=("cost.estimate_time",),
)
