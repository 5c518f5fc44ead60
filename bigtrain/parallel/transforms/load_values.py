"""The values: every parameter and buffer allocated on the device and filled, after the model has been sharded.

From the pretrained safetensors (``model.name_or_path``) or HF's own initialisation under ``train.seed``, one module
at a time, each rank keeping only its shard (``models/materialize.py``), so that no rank holds the whole model
unless the plan replicates it. FSDP2's CPU offload allocates the parameters in host memory. A model DeepSpeed
constructed partitioned already holds its memory: only its values are written, one gathered parameter at a time.
Then the transforms that added parameters give them values (``fill_values``: the adapters' initialisation).
In the simulator the values stay undefined (``values: empty``), on shape-only tensors when it gives a fake mode.
Every part is then put in training mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from bigtrain.models.build import build_meta_model
from bigtrain.models.materialize import materialize, to_empty_keeping_ties
from bigtrain.parallel.transforms.base import BuildContext, BuildOptions, BuiltModel, Transform


@contextlib.contextmanager
def _allocating_under(fake_mode: Any) -> Iterator[None]:
    """Inside ``fake_mode``, taking the meta tensors to_empty reads as inputs."""
    if fake_mode is None:
        yield
        return
    with fake_mode:
        allowed, fake_mode.allow_non_fake_inputs = fake_mode.allow_non_fake_inputs, True
        try:
            yield
        finally:
            fake_mode.allow_non_fake_inputs = allowed  # as the simulator made it (a VLM's batch keeps real ids)


def _param_device(options: BuildOptions) -> torch.device | None:
    """FSDP2's CPU offload wants the sharded parameters in host memory from the start."""
    plan = options.plan
    offloading = plan.backend == "fsdp2" and plan.offload_params and options.device.type == "cuda"
    return torch.device("cpu") if offloading else None


def _allocated(built: BuiltModel, ctx: BuildContext) -> None:
    for transform in built.applied:
        if transform.on_allocated is not None:
            transform.on_allocated(built, ctx)


def _load(built: BuiltModel, ctx: BuildContext) -> None:
    options = ctx.options
    if options.values == "empty":
        with _allocating_under(options.fake_mode):
            for part in built.parts:
                to_empty_keeping_ties(part, options.device)
            _allocated(built, ctx)
    else:
        if not options.partitioned_construction:  # DeepSpeed's partitioned construction allocated already
            for part in built.parts:
                to_empty_keeping_ties(part, options.device, _param_device(options))
        _allocated(built, ctx)
        twin = build_meta_model(options.hf_config, options.attn_implementation)  # walked for the values, whole
        materialize(
            built.parts, twin, options.pretrained, options.seed, built.hf_name, built.convert_value, options.new_head
        )
    for transform in built.applied:
        if transform.fill_values is not None:
            transform.fill_values(built, ctx)
    for part in built.parts:
        part.train()


TRANSFORM = Transform(name="load_values", wanted=lambda options: True, apply=_load)
