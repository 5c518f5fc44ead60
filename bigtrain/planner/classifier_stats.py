"""What the planner needs to know about a classifier: measured on the model itself, whatever its module tree.

A CNN's stages differ in width and resolution, so no "one block times depth" formula describes it. Instead the
model is built on fake tensors (shapes only: no memory, no arithmetic) and one training forward and backward is run
at the workload's image size or row length, twice (micro-batches of 2 and 4 examples):
- FLOPs per example: the forward's from torch's ``FlopCounterMode`` (with the CPU attention kernel's two matmuls,
  which it does not count by itself: ``block_probe.cpu_flop_formulas``), times 3 for forward and backward;
- activation bytes: every tensor storage the forward saves for backward (``saved_tensors_hooks``; parameters
  excluded) and the inputs, per example (the slope between the two batch sizes) and fixed (the intercept: under
  autocast the compute-dtype copies of every weight that backward keeps); under full checkpointing, what the
  blocks' inputs and one block's recompute hold instead of the blocks' own saved tensors;
- the operators one micro-step dispatches (views aside), and, for LoRA, the linears the default adapters adapt and
  the head.
Two precision regimes are measured, as the engines run them: ``autocast`` (DDP: fp32 weights, autocast to the
compute dtype) and ``cast`` (FSDP2 and DeepSpeed: the weights themselves in the compute dtype). BatchNorm layers
run as the trainer runs them (``parallel/transforms/batch_norm.py``: fp32 over an fp32 copy of their input).
Parameters come from the meta model; the FSDP2 units from the family's ``_no_split_modules`` as the trainer shards
them. Measuring takes 3 s (ResNet-50 at 224 px) to 12 s (BERT-large at 512 tokens) on one CPU core.
"""

from __future__ import annotations

import copy
import functools
import json
import warnings
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from bigtrain.config.diffusers_config import VAE_SCALE, DiffusersTransformerConfig, construct, denoise_inputs
from bigtrain.config.hf import (
    classifier_heads,
    decoder_blocks,
    is_linear,
    linear_names,
    model_class,
    model_config_object,
    names_module,
    resolve_attention,
)
from bigtrain.config.model_facts import ModelFacts
from bigtrain.errors import ConfigError
from bigtrain.planner.block_probe import cpu_flop_formulas
from bigtrain.planner.classifier_record import CHECKPOINTED, ClassifierStats

REGIMES = ("autocast", "cast")  # DDP's; FSDP2's and DeepSpeed's (module docstring)
SIZES = (2, 4)  # the micro-batches measured: the slope between them is the per-example term


def measure_classifier(
    model_config: dict[str, Any],
    image_size: int,
    seq_len: int,
    mixed_precision: str,
    task: str = "image-classification",
    unit: str = "images",
) -> ClassifierStats:
    """The stats of a classifier (its config dict names its class) at an image size (image classifiers) or row
    length (sequence classifiers); cached per configuration (the search asks once per candidate GPU count).
    ``task`` and ``unit``: its task's name and what its throughput counts (the spec's)."""
    key = json.dumps(model_config, sort_keys=True, default=str)
    return _measured(key, image_size, seq_len, mixed_precision, task, unit)


@functools.lru_cache(maxsize=16)
def _measured(key: str, image_size: int, seq_len: int, mixed_precision: str, task: str, unit: str) -> ClassifierStats:
    hf_config = model_config_object(json.loads(key))
    meta = _meta_model(hf_config)
    params = sum(p.numel() for p in meta.parameters())
    units = [sum(p.numel() for p in block.parameters()) for block in _blocks(meta)]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[mixed_precision]
    per_example, fixed, flops, ops = [], [], 0.0, 0
    for regime in REGIMES:
        peaks: dict[str, list[float]] = {regime: [], regime + CHECKPOINTED: []}
        for b in SIZES:
            held, checkpointed, step_flops, ops = _fake_step(meta, hf_config, b, image_size, seq_len, dtype, regime)
            peaks[regime].append(held)
            peaks[regime + CHECKPOINTED].append(checkpointed)
            flops = step_flops / b
        for key, (small, large) in peaks.items():
            slope = (large - small) / (SIZES[1] - SIZES[0])
            per_example.append((key, slope))
            fixed.append((key, max(0.0, small - slope * SIZES[0])))
    channels = getattr(hf_config, "num_channels", 3)
    example = f"{channels}x{image_size}x{image_size} px" if image_size else f"{seq_len} tokens"
    batch_norm = bool(_batch_norms(meta))
    return ClassifierStats(
        model_type=hf_config.model_type,
        task=task,
        unit=unit,
        params=params,
        largest_unit=max([*units, params - sum(units)]),
        largest_block=max(units, default=0),
        blocks=len(units),
        convolutional=sum(isinstance(m, nn.Conv2d) for m in meta.modules()) > 2,
        batch_norm=batch_norm,
        flops_per_example=flops,
        operators=ops,
        per_example=tuple(per_example),
        fixed=tuple(fixed),
        example=example,
        adapted=_adapted(meta),
        head_params=sum(p.numel() for name in _head(meta, hf_config) for p in meta.get_submodule(name).parameters()),
        facts=ModelFacts.of(
            hf_config,
            batch_norm=batch_norm,
            convolutional=any(isinstance(m, nn.Conv2d) for m in meta.modules()),
            block_linears=bool(_adapted(meta)),
        ),
    )


def _meta_model(hf_config: Any) -> nn.Module:
    """The model its config names on meta: a transformers class, or a diffusion transformer (text-to-image: the same
    measurements, on its own inputs and loss)."""
    if isinstance(hf_config, DiffusersTransformerConfig):
        with torch.device("meta"):
            return construct(hf_config)
    cls = model_class(hf_config)
    if cls is None:
        raise ConfigError(f"{hf_config.model_type}: the classifier's config names no class (architectures)")
    hf_config.attn_implementation = resolve_attention(hf_config, "auto")  # the family's own (none for a CNN)
    with torch.device("meta"):
        return cls._from_config(hf_config)


def _step_loss(model: nn.Module, hf_config: Any, inputs: dict[str, Any], target: torch.Tensor) -> torch.Tensor:
    """The training loss of one forward: a classifier's cross-entropy, a diffusion transformer's squared error."""
    if isinstance(hf_config, DiffusersTransformerConfig):
        prediction = model(**inputs).sample
        return ((prediction.float() - target.float()) ** 2).mean(-1).mean(-1).sum()
    logits = model(**inputs).logits
    return torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum")


def _adapted(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """(in, out) of the linears the trainer's default LoRA adapts: peft matches the names of the blocks' linears
    (``parallel/transforms/adapters.py``) anywhere in the model."""
    targets, _ = linear_names(model) if _blocks(model) else ([], [])
    return tuple(
        (m.in_features, m.out_features)
        for name, m in model.named_modules()
        if is_linear(m) and any(names_module(t, name) for t in targets)
    )


def _head(model: nn.Module, hf_config: Any) -> list[str]:
    try:
        return classifier_heads(model, hf_config.num_labels)
    except ConfigError:
        return []


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks the trainer shards (FSDP2 units) and checkpoints: ``decoder_blocks``' (none: an empty list)."""
    try:
        return [block for _, _, block in decoder_blocks(model)]
    except ConfigError:
        return []


def _batch_norms(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _as_trained(norm: nn.Module) -> None:
    """A BatchNorm as the trainer runs it (``parallel/transforms/batch_norm.py``, which the simulator runs and
    bench/classifier_memory.py compares with this): on an fp32 copy of its input, kept for backward, its output cast
    back to the input's dtype."""
    dtypes: list[torch.dtype] = []

    def upcast(module: nn.Module, args: tuple) -> tuple:
        dtypes.append(args[0].dtype)
        return (args[0].float(), *args[1:])

    norm.register_forward_pre_hook(upcast)
    norm.register_forward_hook(lambda module, args, out: out.to(dtypes.pop()))


def _fake_step(
    meta: nn.Module, hf_config: Any, b: int, image_size: int, seq_len: int, dtype: torch.dtype, regime: str
) -> tuple[float, float, float, int]:
    """(activation bytes, the same with every block checkpointed, FLOPs, operators) of one forward and backward of a
    micro-batch of ``b`` (backward taken as twice the forward)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    cast = regime == "cast" and dtype != torch.float32
    model = copy.deepcopy(meta)
    for module in _batch_norms(model):
        _as_trained(module)
    with FakeTensorMode():
        # every parameter and buffer a fake CPU tensor (construction code may read values: it ran on meta);
        # cast weights in the compute dtype, BatchNorm's kept fp32 as the engines keep them
        keep_fp32 = set(_batch_norms(model))
        for module in model.modules():
            want = dtype if cast and module not in keep_fp32 else None
            for name, param in list(module.named_parameters(recurse=False)):
                fake = torch.empty(param.shape, dtype=want or param.dtype)
                setattr(module, name, nn.Parameter(fake, requires_grad=param.requires_grad))
            for name, buffer in list(module.named_buffers(recurse=False)):
                module._buffers[name] = torch.empty(buffer.shape, dtype=buffer.dtype)
        model.train()
        inputs, labels = _step_inputs(hf_config, b, image_size, seq_len)
        if cast:  # FSDP2 and DeepSpeed hand the model its float inputs in the compute dtype
            for name in ("pixel_values", "hidden_states", "encoder_hidden_states", "pooled_projections"):
                if name in inputs:
                    inputs[name] = inputs[name].to(dtype)
        params = {p.untyped_storage()._cdata for p in model.parameters()}
        saved: dict[int, tuple[int, int | None]] = {}  # storage -> (bytes, the block that saved it first, or None)
        block_inputs: dict[int, int] = {}  # storage -> bytes of what entered a block
        current: list[int | None] = [None]
        # what is recorded by its storage's address stays alive while the step runs: a freed block input's address
        # reused by a later tensor would otherwise be taken for it (BERT's checkpointed terms varied run to run)
        alive: list[torch.Tensor] = []

        def keep(t: torch.Tensor) -> torch.Tensor:  # what backward will read: held from its forward to its backward
            storage = t.untyped_storage()
            if storage._cdata not in params and storage._cdata not in saved:
                saved[storage._cdata] = (storage.nbytes(), current[0])
                alive.append(t)
            return t

        for index, block in enumerate(_blocks(model)):
            entered = partial(_entered, index, current, block_inputs, params, alive)
            block.register_forward_pre_hook(entered, with_kwargs=True)
            block.register_forward_hook(lambda *_: current.__setitem__(0, None))

        autocast = not cast and dtype != torch.float32
        hooks = torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t)
        # the CPU's attention kernel is one torch's counter does not know: its two matmuls counted by formula
        with FlopCounterMode(display=False, custom_mapping=cpu_flop_formulas()) as flops, hooks, _CountOps() as ops:
            with torch.autocast("cpu", dtype=dtype, enabled=autocast), warnings.catch_warnings():
                # FLUX's RMSNorm on fake bf16 inputs with fp32 weights: torch says it takes the unfused kernel
                warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
                loss = _step_loss(model, hf_config, inputs, labels)
        loss.backward()
        given = sum(t.untyped_storage().nbytes() for t in inputs.values())
        held = sum(n for n, _ in saved.values()) + given
        # under full checkpointing each block keeps only what entered it, and backward recomputes one block at a
        # time: what it saved is held again, for the largest block
        outside = {k: n for k, (n, owner) in saved.items() if owner is None}
        within: dict[int, int] = {}
        for n, owner in saved.values():
            if owner is not None:
                within[owner] = within.get(owner, 0) + n
        entered = sum(n for k, n in block_inputs.items() if k not in outside)
        held_checkpointed = sum(outside.values()) + entered + max(within.values(), default=0) + given
        # backward as twice the forward (the input's and the weight's gradient): torch's counter overcounts a
        # grouped convolution's backward by its group count (ConvNeXt-B's depthwise ones: 183 GFLOP for 1.1 forward)
        return float(held), float(held_checkpointed), 3.0 * float(flops.get_total_flops()), 3 * ops.count


def _entered(
    index: int, current: list[int | None], block_inputs: dict[int, int], params: set[int], alive: list[torch.Tensor],
    module: nn.Module, args: tuple, kwargs: dict[str, Any],
) -> None:  # fmt: skip
    """A block's forward begins: what it saves is its own; its tensor inputs are what checkpointing keeps of it."""
    current[0] = index
    for t in [*args, *kwargs.values()]:
        if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in params:
            block_inputs[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
            alive.append(t)


_NO_KERNEL = (torch.ops.aten.detach.default, torch.ops.aten.empty.memory_format, torch.ops.aten.lift_fresh.default)


class _CountOps(TorchDispatchMode):
    """Counts the operators dispatched (each a kernel launch on a GPU: the floor of a small micro-step's time)."""

    count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func.is_view and func not in _NO_KERNEL:  # a view or a detach launches nothing
            self.count += 1
        return func(*args, **(kwargs or {}))


def _step_inputs(hf_config: Any, b: int, image_size: int, seq_len: int) -> tuple[dict[str, Any], torch.Tensor]:
    """(the model's inputs, what its loss compares them with): labels, or a diffusion transformer's target."""
    if isinstance(hf_config, DiffusersTransformerConfig):
        return denoise_inputs(hf_config, b, image_size // VAE_SCALE, seq_len)
    return example_inputs(hf_config, b, image_size, seq_len), torch.randint(0, hf_config.num_labels, (b,))


def example_inputs(
    hf_config: Any, b: int, image_size: int, seq_len: int, device: torch.device | None = None
) -> dict[str, torch.Tensor]:
    """A classifier's inputs as its data path makes them (values aside): ``b`` images of ``image_size`` pixels a side,
    channels first, or ``b`` token rows of ``seq_len`` with their attention mask."""
    if image_size:
        channels = getattr(hf_config, "num_channels", 3)
        return {"pixel_values": torch.randn(b, channels, image_size, image_size, device=device)}
    ids = torch.randint(0, hf_config.vocab_size, (b, seq_len), device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
