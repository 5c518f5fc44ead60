"""Channels-last memory layout for convolutional models (the channels_last record's step, ``parallel.channels_last``).

A 4-D image batch is laid out NCHW by default; convolution kernels on tensor cores (cuDNN, and oneDNN on CPUs) work
on NHWC and otherwise transpose around every convolution. torch keeps a tensor's logical shape and changes only its
strides: a convolution given a channels-last input (or weight) answers channels-last, so the layout carries through
the network from the input. Two parts, as torchvision's reference recipe does (``model.to(memory_format=...)`` and
each batch converted):
- every image batch the model is called with becomes channels-last (a forward pre-hook on the model, whatever
  engine drives it);
- under DDP the convolution weights too, after their values are loaded and before DDP builds its buckets (its
  gradient buckets then take the weights' strides). FSDP2 and DeepSpeed gather their weights into buffers of their
  own layout, where the input's layout still decides the convolutions'.
The numbers are those of the other layout up to float rounding (the equivalence test runs a plan with it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bigtrain.config.capabilities.channels_last import CHANNELS_LAST
from bigtrain.parallel.transforms.base import BuildContext, BuildOptions, BuiltModel, Transform


def wanted(options: BuildOptions) -> bool:
    return bool(CHANNELS_LAST.of(options.plan))


def apply(built: BuiltModel, ctx: BuildContext) -> None:
    for part in built.parts:
        part.register_forward_pre_hook(_channels_last_inputs, with_kwargs=True)
        if built.plan.backend == "ddp":
            for module in part.modules():
                if isinstance(module, nn.Conv2d):
                    module.weight.data = module.weight.data.contiguous(memory_format=torch.channels_last)


def _channels_last_inputs(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    pixels = kwargs.get("pixel_values")
    if isinstance(pixels, torch.Tensor) and pixels.dim() == 4:
        kwargs = {**kwargs, "pixel_values": pixels.contiguous(memory_format=torch.channels_last)}
    return args, kwargs


# the layout changes no byte of memory; the search lays a convolutional model out so on GPUs (its record's variant)
# its memory: the same bytes in another layout, which the classifier's measured statistics count (its gain on tensor
# cores is not in the time model: the channels_last record says so)
TRANSFORM = Transform(
    name="channels_last", wanted=wanted, apply=apply, planner_terms=("classifier_stats.measure_classifier",)
)
