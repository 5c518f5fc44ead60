"""The model transforms, one file each, and the one order in which ``parallel/build.py`` applies them.

Why this order (torchtitan's, extended):
- adapters first: each LoRA adapter joins the block of the linear it adapts before anything slices, wraps or shards
  that block;
- frozen parts (``model.freeze``, the freeze record's step) next, before anything wraps or shards them: no gradient
  or optimizer state is made for them;
- the pipeline split first: every later step works on this rank's stages only, and each stage is a HF model of its
  own under the unsplit model's parameter names;
- tensor parallelism slices the projections before anything wraps or shards them, so FSDP2 shards the slices
  (2-D DTensors over dp x tp) and no rank holds a whole matrix;
- expert parallelism splits the experts over the ep ranks, for the same reason (FSDP2 then shards each expert over
  the ranks that hold it);
- FP8 linears (train.fp8) replace the blocks' linears before anything wraps or shards them (torchtitan's order);
- the chunked loss takes the LM head out of the forward (of the last stage) before anything wraps or shards it;
- activation checkpointing wraps the sliced blocks, and compile compiles the wrapped ones, both before FSDP2, so
  FSDP2's all-gather hooks sit outside the recomputed and the compiled region;
- BatchNorm layers (the batch_norm record's step) learn which ranks' statistics they normalise by before FSDP2 or
  DDP wraps them;
- activation offload wraps them once more: its saved-tensor hooks sit outside the recompute (so they catch what a
  checkpointed block keeps, its input) and outside the compiled region, inside FSDP2's gathers;
- FSDP2 shards on meta: nothing of the unsharded model is ever allocated;
- then the values are allocated and loaded, each rank writing only its shards;
- channels-last layout (the channels_last record's step) after the values exist, before DDP's buckets take the
  weights' strides;
- context parallelism then points the model's attention at its all-to-all attention (after the values: loading
  builds a twin of the model from the same config object, which would set the config's attention back);
- DDP last: it broadcasts real values.
Adding a built-in transform is one new file here and its line in ``BUILT_IN``; a capability record may bring its own
(``Capability.steps``), which ``ORDER`` places after the transform each names (``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from importlib import import_module

from bigtrain.config.capabilities import CAPABILITIES, Capability, ModelStep
from bigtrain.parallel.transforms import (
    activation_checkpoint,
    activation_offload,
    adapters,
    chunked_loss,
    compile_blocks,
    context_parallel,
    ddp,
    expert_parallel,
    float8,
    fsdp,
    load_values,
    pipeline_split,
    tensor_parallel,
)
from bigtrain.parallel.transforms.base import Transform

BUILT_IN: tuple[Transform, ...] = (
    adapters.TRANSFORM,
    pipeline_split.TRANSFORM,
    tensor_parallel.TRANSFORM,
    expert_parallel.TRANSFORM,
    float8.TRANSFORM,
    chunked_loss.TRANSFORM,
    activation_checkpoint.TRANSFORM,
    compile_blocks.TRANSFORM,
    activation_offload.TRANSFORM,
    fsdp.TRANSFORM,
    load_values.TRANSFORM,
    context_parallel.TRANSFORM,
    ddp.TRANSFORM,
)


def with_record_steps(order: Sequence[Transform], capabilities: Sequence[Capability]) -> tuple[Transform, ...]:
    """``order`` with the transforms the capability records bring (``Capability.steps``), each right after the
    transform it names (records in their order when two name the same one)."""
    out = list(order)
    for capability in capabilities:
        for step in capability.steps:
            names = [t.name for t in out]
            if step.after not in names:
                raise ValueError(f"{capability.name}: its step {step.name!r} follows {step.after!r}, not in {names}")
            out.insert(names.index(step.after) + 1, step_transform(step))
    return tuple(out)


def step_transform(step: ModelStep) -> Transform:
    """A record's step as a transform: its code's ``TRANSFORM`` (``ModelStep.code``), or one made of its ``apply``;
    the record's ``wanted`` and planner terms where it gives them."""
    if step.code is not None:
        transform: Transform = import_module(step.code).TRANSFORM
        if transform.name != step.name:
            raise ValueError(f"step {step.name!r} names {step.code}, whose transform is {transform.name!r}")
    else:
        assert step.apply is not None and step.wanted is not None, f"step {step.name!r}: give apply and wanted"
        transform = Transform(step.name, step.wanted, step.apply)
    if step.wanted is not None:
        transform = replace(transform, wanted=step.wanted)
    return replace(transform, planner_terms=step.planner_terms or transform.planner_terms)


ORDER: tuple[Transform, ...] = with_record_steps(BUILT_IN, CAPABILITIES)
