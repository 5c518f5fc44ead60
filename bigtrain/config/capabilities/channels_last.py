"""Channels-last memory layout for convolutional models (``parallel.channels_last``; ``parallel/transforms/
channels_last.py`` runs it): the layout tensor cores' convolutions read directly. Numerics unchanged.

The planner lays a convolutional model out so on GPUs (torchvision's and NVIDIA's reference recipes for AMP do);
its memory is the same, and its gain is not in the time model.
"""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, ModelStep, Option, Plan, SearchSpace, row
from bigtrain.config.setup import Setup

CHANNELS_LAST = Option(
    "channels_last",
    False,
    "Convolutional models: images and activations in channels-last memory layout (NHWC), the layout tensor cores' "
    "convolutions read directly; DDP lays out the convolution weights so too. Numerics unchanged.",
    example=True,
)


def channels_last_without_convolutions(s: Setup) -> str | None:
    if s.model is None or s.model.convolutional or not CHANNELS_LAST.of(s.plan):
        return None
    return (
        f"parallel.channels_last=true, but {s.model.model_type} has no 2-D convolution (the layout changes nothing "
        "in it); leave parallel.channels_last=false"
    )


def _on_gpus(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    """A convolutional model on GPUs: every plan channels-last (a pin decides otherwise)."""
    if space.pinned(CHANNELS_LAST.name):
        return [plan.with_option(CHANNELS_LAST.name, space.fixed[CHANNELS_LAST.name]) for plan in plans]
    if not space.facts.convolutional or not space.on_gpus:
        return plans
    return [plan.with_option(CHANNELS_LAST.name, True) for plan in plans]


CAPABILITY = Capability(
    name="channels_last",
    summary="channels-last layout of a convolutional model's images and activations",
    rules=(row(channels_last_without_convolutions, "invalid", reads_model=True),),
    options=(CHANNELS_LAST,),
    variants=_on_gpus,
    # after the values exist (DDP's buckets then take the convolution weights' strides), before DDP
    steps=(ModelStep("channels_last", after="load_values", code="bigtrain.parallel.transforms.channels_last"),),
)
