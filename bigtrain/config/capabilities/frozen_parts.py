"""Where a text-to-image job's frozen parts run (``parallel.frozen_parts``): the VAE and text encoders of the diffusers
pipeline, which turn each image and caption into the latents and prompt embeddings the trained transformer reads.

- ``cached``: their outputs computed once into the data cache before step 1 (``data/encoded_images.py``): no memory
  and no compute during training; the pass over the images is paid once per data and pipeline, and every later run
  of the same reads it;
- ``device``: loaded on every GPU in the compute dtype for the run, each step encoding that rank's images and captions
  before the transformer's forward (``roles/frozen_parts.py``): their weights stay on the device;
- ``offloaded``: kept in host memory and moved to the GPU one at a time for their forward, and back, once a step
  (diffusers' model offload, accelerate's hooks): the largest part's weights for the encode, and PCIe traffic.
``auto`` is ``cached``: it holds the least on the device and computes nothing per step. ``planner/frozen_parts.py``
weighs each placement's memory and time; the plan note says what the others would cost.
"""

from __future__ import annotations

from typing import Any

from bigtrain.config.capabilities.table import Capability, Option, SearchSpace, row
from bigtrain.config.plan import Plan
from bigtrain.config.setup import Setup

ROLE = "frozen_parts"  # the role an objective's spec names (flow-matching's: ``ObjectiveSpec.roles``)
PLACEMENTS = ("auto", "cached", "device", "offloaded")
LIVE = ("device", "offloaded")  # placements that run the parts during training
FROZEN_PARTS = Option(
    "frozen_parts",
    "auto",
    "text-to-image: where the pipeline's VAE and text encoders run: cached (their outputs computed once into the "
    "data cache: no memory, no compute per step), device (on every GPU for the run, encoding each step's images and "
    "captions), offloaded (in host memory, moved to the GPU one at a time to encode each step's, and back); auto: "
    "cached.",
)


def placement_of(options: Any) -> str:
    """The placement a plan (or a recipe's ``parallel.options`` dict) asks for, auto resolved."""
    value = options.get(FROZEN_PARTS.name, "auto") if isinstance(options, dict) else FROZEN_PARTS.of(options)
    return "cached" if value == "auto" else value


def _frozen_parts_value(s: Setup) -> str | None:
    value = FROZEN_PARTS.of(s.plan)
    if value in PLACEMENTS:
        return None
    return (
        f"parallel.frozen_parts={value!r} is not a placement; use one of {', '.join(PLACEMENTS)} (device: on each "
        "GPU)"
    )


def _frozen_parts_without_a_pipeline(s: Setup) -> str | None:
    value = FROZEN_PARTS.of(s.plan)
    if value == "auto" or s.job is None or ROLE in s.job.roles:
        return None
    return (
        f"parallel.frozen_parts={value}: model.task={s.job.task} has no frozen VAE or text encoders (a text-to-image "
        "pipeline's, trained with train.objective=flow-matching, does); leave parallel.frozen_parts=auto"
    )


def _pinned(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    """A pinned placement carried on every plan; auto stays auto (cached: it dominates, module docstring)."""
    if not space.pinned(FROZEN_PARTS.name):
        return plans
    return [plan.with_option(FROZEN_PARTS.name, space.fixed[FROZEN_PARTS.name]) for plan in plans]


CAPABILITY = Capability(
    name="frozen_parts",
    summary="a text-to-image pipeline's VAE and text encoders cached, on the device or offloaded",
    rules=(
        row(_frozen_parts_value, "invalid"),
        row(_frozen_parts_without_a_pipeline, "invalid", reads_job=True),
    ),
    options=(FROZEN_PARTS,),
    variants=_pinned,
    pinned_only=True,
)
