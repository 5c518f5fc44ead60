"""Vision-language models (``model.task: image-text-to-text``): chat rows with images, trained on data-parallel plans
(DDP, FSDP2, HSDP, DeepSpeed ZeRO) in full or through LoRA on the language model, with parts frozen
(``model.freeze``, ``parallel/transforms/freeze.py``).

Tensor parallelism slices the language model's blocks by its own layout (the text config's ``base_model_tp_plan``),
the tower whole on every tp rank. What else splits a decoder's blocks, sequence or vocabulary (pp, cp, ep, sequence
parallelism, the chunked and vocabulary-parallel losses) is a row until it is built for these models: the image
features are merged into the language model's input inside the model's own forward, which the splits do not see.
FP8, activation offload, compile and the preference objectives are rows until tested on them. QLoRA quantises the
linears LoRA adapts, the language model's by default: the tower and the projector stay a frozen base in the compute
dtype.
"""

from __future__ import annotations

from typing import Any

from bigtrain.config.capabilities.table import Capability, first_unbuilt, row, split_settings
from bigtrain.config.plan import Plan
from bigtrain.config.setup import Setup
from bigtrain.config.workload import Workload

TASK = "image-text-to-text"


def _vision_language(s: Setup) -> bool:
    return s.model is not None and s.model.task == TASK


def vision_language_with_model_parallelism(s: Setup) -> str | None:
    if not _vision_language(s):
        return None
    for key, value, default in split_settings(s.plan):
        if value != default and key != "tp":  # tp slices the language model's blocks by its own layout
            return (
                f"parallel.{key}={str(value).lower()} with model.task={TASK} is not built yet (the image features "
                "join the language model inside the model's own forward); train it with data parallelism: backend "
                f"ddp, fsdp2 or deepspeed, parallel.{key}={str(default).lower()}"
            )
    return None


def vision_language_with_untested_options(s: Setup) -> str | None:
    if not _vision_language(s):
        return None
    p, t = s.plan, s.train
    return first_unbuilt(
        TASK,
        (
            ("train.fp8", t.fp8, t.fp8 not in ("none", "auto"), "none"),
            ("train.compile", "true", t.compile is True, "false"),
            ("parallel.offload_activations", "true", p.offload_activations, "false"),
            ("train.objective", t.objective, t.objective != "sft", "sft"),
        ),
    )


def vision_bytes(stats: Any, plan: Plan, workload: Workload) -> int:
    """What a vision-language model's images keep for backward on a rank (``planner/vision_stats.py``): the tower's
    parameters, gradients and optimizer states are among the model's (``ModelStats.params``)."""
    return stats.vision.activation_bytes(plan, workload) if getattr(stats, "vision", None) is not None else 0


CAPABILITY = Capability(
    name="vision_language",
    summary="vision-language chat models (model.task: image-text-to-text): images through the processor, parts frozen",
    keys=("model.freeze", "data.processor", "data.min_pixels", "data.max_pixels", "data.image_field"),
    rules=(
        row(vision_language_with_model_parallelism, "not_built", reads_model=True),
        row(vision_language_with_untested_options, "not_built", reads_model=True),
    ),
    transforms=("freeze",),
    memory=vision_bytes,
)
