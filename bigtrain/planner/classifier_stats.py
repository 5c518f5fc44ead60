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
  the head;
- each block's parameters in forward order and its share of the activations per example, where FSDP2's backward
  peak is (``classifier_plan.py``: FLUX's large double-stream blocks come first, its smaller single-stream ones last,
  so backward starts among the small ones).
Three regimes are measured, as the engines run them: ``autocast`` (DDP: fp32 weights, autocast to the compute dtype),
``cast`` (FSDP2 and DeepSpeed: the weights themselves in the compute dtype) and ``lora`` (cast, with only the adapted
linears' weights and the head trained: backward keeps what their weights' gradients read, which LoRA's adapters read
too, and not what a frozen linear's would; FLUX's default adapters leave its MLPs frozen, whose inputs a fully trained
model keeps). BatchNorm layers
run as the trainer runs them (``parallel/transforms/batch_norm.py``: fp32 over an fp32 copy of their input).
Parameters come from the meta model; the FSDP2 units from the family's ``_no_split_modules`` as the trainer shards
them. Measuring takes 3 s (ResNet-50 at 224 px) to 12 s (BERT-large at 512 tokens) on one CPU core.
"""

from __future__ import annotations

import copy
import functools
import json
import warnings
import weakref
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from bigtrain.config.diffusers_config import DiffusersTransformerConfig, construct, denoise_inputs
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

REGIMES = ("autocast", "cast", "lora")  # DDP's; FSDP2's and DeepSpeed's; under LoRA (module docstring)
SIZES = (2, 4)  # the micro-batches measured: the slope between them is the per-example term


def measure_classifier(
    model_config: dict[str, Any],
    image_size: int,
    seq_len: int,
    mixed_precision: str,
    task: str = "image-classification",
    unit: str = "images",
    method: str | None = None,
) -> ClassifierStats:
    """The stats of a classifier (its config dict names its class) at an image size (image classifiers) or row
    length (sequence classifiers); cached per configuration (the search asks once per candidate GPU count).
    ``task`` and ``unit``: its task's name and what its throughput counts (the spec's); ``method``: the regimes
    train.method plans with only (full: autocast and cast; lora: lora), else all (a preset's record)."""
    key = json.dumps(model_config, sort_keys=True, default=str)
    return _measured(key, image_size, seq_len, mixed_precision, task, unit, method)


@functools.lru_cache(maxsize=16)
def _measured(
    key: str, image_size: int, seq_len: int, mixed_precision: str, task: str, unit: str, method: str | None
) -> ClassifierStats:
    hf_config = model_config_object(json.loads(key))
    meta = _meta_model(hf_config)
    params = sum(p.numel() for p in meta.parameters())
    units = [sum(p.numel() for p in block.parameters()) for block in _blocks(meta)]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[mixed_precision]
    per_example, fixed, flops, ops = [], [], 0.0, 0
    shares = {False: [0.0] * len(units), True: [0.0] * len(units)}  # (not) checkpointed
    regimes = {None: REGIMES, "full": REGIMES[:2], "lora": REGIMES[2:]}[method]
    if not _adapted(meta):  # no LoRA regime where LoRA does not apply: its plans read cast's
        regimes = REGIMES[:2] if method is None else REGIMES[1:2] if method == "lora" else regimes
    shared = "cast" if "cast" in regimes else regimes[-1]  # the regime whose shares are recorded (lora's: alone)
    for regime in regimes:
        peaks: dict[str, list[float]] = {regime: [], regime + CHECKPOINTED: []}
        per_block = []
        for b in SIZES:
            held, checkpointed, step_flops, ops, blocks = _fake_step(
                meta, hf_config, b, image_size, seq_len, dtype, regime
            )
            peaks[regime].append(held)
            peaks[regime + CHECKPOINTED].append(checkpointed)
            per_block.append(blocks)
            flops = step_flops / b
        for checkpointed, key in ((False, regime), (True, regime + CHECKPOINTED)):
            slope = peaks[key][1] - peaks[key][0]
            if regime == shared and slope > 0:  # each block's share of the per-example slope
                mine = [blocks[checkpointed] for blocks in per_block]
                shares[checkpointed] = [(large - small) / slope for small, large in zip(*mine, strict=True)]
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
        units=tuple(units),
        unit_shares=tuple(round(x, 4) for x in shares[False]),
        checkpointed_shares=tuple(round(x, 4) for x in shares[True]),
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
        return ((prediction.float() - target.float()) ** 2).flatten(1).mean(1).sum()
    logits = model(**inputs).logits
    return torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum")


def _adapted(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """(in, out) of the linears the trainer's default LoRA adapts."""
    return tuple((m.in_features, m.out_features) for m in _adapted_modules(model))


def _adapted_modules(model: nn.Module) -> list[nn.Module]:
    """The linears the trainer's default LoRA adapts: peft matches the names of the blocks' linears
    (``parallel/transforms/adapters.py``) anywhere in the model."""
    targets, _ = linear_names(model) if _blocks(model) else ([], [])
    return [m for name, m in model.named_modules() if is_linear(m) and any(names_module(t, name) for t in targets)]


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
) -> tuple[float, float, float, int, tuple[list[int], list[int]]]:
    """(activation bytes, the same with every block checkpointed, FLOPs, operators, (the bytes each block saved, those
    checkpointing keeps of each: its inputs)) of one forward and backward of a micro-batch of ``b`` (backward taken as
    twice the forward)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    cast = regime != "autocast" and dtype != torch.float32
    model = _as_regime(copy.deepcopy(meta), hf_config, regime)
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
        block_inputs: dict[int, tuple[int, int]] = {}  # storage -> (bytes, the first block it entered)
        current: list[int | None] = [None]
        # what is recorded by its storage's address stays alive while the step runs: a freed block input's address
        # reused by a later tensor would otherwise be taken for it (BERT's checkpointed terms varied run to run)
        alive: list[torch.Tensor] = []
        backward = _BackwardMemory()

        def keep(t: torch.Tensor) -> torch.Tensor:  # what backward will read: held from its forward to its backward
            storage = t.untyped_storage()
            if storage._cdata not in params and storage._cdata not in saved:
                saved[storage._cdata] = (storage.nbytes(), current[0])
                alive.append(t)
                backward.track(storage)
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
        for param in model.parameters():  # the engines reduce gradients away: their own terms count them
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
        alive.clear()  # backward releases what it has read, as a real step does
        with backward:
            loss.backward()
        given = sum(t.untyped_storage().nbytes() for t in inputs.values()) + backward.beyond_forward
        held = sum(n for n, _ in saved.values()) + given
        outside, within, inputs_of = _by_block(saved, block_inputs, len(_blocks(model)))
        # under full checkpointing each block keeps only what entered it, and backward recomputes one block at a
        # time: what it saved is held again, for the largest block
        held_checkpointed = outside + sum(inputs_of) + max(within, default=0) + given
        blocks = (within, inputs_of)
        # backward as twice the forward (the input's and the weight's gradient): torch's counter overcounts a
        # grouped convolution's backward by its group count (ConvNeXt-B's depthwise ones: 183 GFLOP for 1.1 forward)
        return float(held), float(held_checkpointed), 3.0 * float(flops.get_total_flops()), 3 * ops.count, blocks


def _as_regime(model: nn.Module, hf_config: Any, regime: str) -> nn.Module:
    """The model as the regime trains it: under ``lora`` the adapted linears' weights and the head stand in for the
    adapters (backward keeps what they read), the rest frozen; BatchNorm as the trainer runs it."""
    if regime == "lora":
        trained = _adapted_modules(model) + [model.get_submodule(name) for name in _head(model, hf_config)]
        for param in model.parameters():
            param.requires_grad_(False)
        for module in trained:
            for param in module.parameters():
                param.requires_grad_(True)
    for module in _batch_norms(model):
        _as_trained(module)
    return model


def _by_block(
    saved: dict[int, tuple[int, int | None]], block_inputs: dict[int, tuple[int, int]], blocks: int
) -> tuple[int, list[int], list[int]]:
    """(bytes saved outside every block, bytes each block saved, bytes of each block's inputs not saved outside:
    what checkpointing keeps of it)."""
    outside = {k for k, (_, owner) in saved.items() if owner is None}
    within = [0] * blocks
    for n, owner in saved.values():
        if owner is not None:
            within[owner] += n
    inputs_of = [0] * blocks
    for k, (n, index) in block_inputs.items():
        if k not in outside:
            inputs_of[index] += n
    return sum(saved[k][0] for k in outside), within, inputs_of


def _entered(
    index: int, current: list[int | None], block_inputs: dict[int, tuple[int, int]], params: set[int],
    alive: list[torch.Tensor],
    module: nn.Module, args: tuple, kwargs: dict[str, Any],
) -> None:  # fmt: skip
    """A block's forward begins: what it saves is its own; its tensor inputs are what checkpointing keeps of it."""
    current[0] = index
    for t in [*args, *kwargs.values()]:
        if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in params:
            block_inputs.setdefault(t.untyped_storage()._cdata, (t.untyped_storage().nbytes(), index))
            alive.append(t)


class _BackwardMemory(TorchDispatchMode):
    """How far backward's live bytes rise above what forward saved: the saved activations, released as backward reads
    them, beside what backward allocates and frees again (the activations' gradients, a kernel's fp32 accumulators: a
    memory tracker's temporaries). FLUX's backward starts in its largest activations and rises a tenth above them in
    a 3-block step; a CNN's largest gradients come in its first stages, whose saved tensors are read last, and stay
    below. What an operator returns in its inputs' storage is not new."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = self.start = 0

    def track(self, storage: torch.UntypedStorage) -> None:
        self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, storage.nbytes())

    def __enter__(self) -> _BackwardMemory:
        self.start = self.peak = self.live
        return super().__enter__()

    @property
    def beyond_forward(self) -> int:
        return max(0, self.peak - self.start)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage()._cdata for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in given:
                given.add(t.untyped_storage()._cdata)
                self.track(t.untyped_storage())
        return out

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes


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
        return denoise_inputs(hf_config, b, hf_config.latent_side(image_size), seq_len)
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
