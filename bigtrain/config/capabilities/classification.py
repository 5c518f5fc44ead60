"""Image and sequence classification (``model.task``): models with one label per example, trained on data-parallel
plans (DDP, FSDP2, HSDP, DeepSpeed ZeRO), with BatchNorm's statistics kept or synchronised across ranks.

Everything a causal LM's plan may add beyond data parallelism is a row here until it is built for these tasks: each
of tp, pp, cp and ep splits a decoder's blocks, heads or sequence; the chunked and vocabulary-parallel losses work on
an LM head; FP8, activation offload and QLoRA wrap or rewrite decoder blocks and are tested on causal LMs only.
Activation checkpointing and compile wrap a classifier's blocks (its ``_no_split_modules``) unless it has BatchNorm
(a recompute would update its statistics twice; compiling the data-parallel BatchNorm is not tried); LoRA adapts the
linears of its blocks, its head trained fully.
"""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, Option, first_unbuilt, row, split_settings
from bigtrain.config.setup import Setup

CLASSIFIERS = ("image-classification", "sequence-classification")
SYNC_BATCHNORM = Option(
    "sync_batchnorm",
    False,
    "BatchNorm statistics of a micro-step over every data-parallel rank's images together (SyncBatchNorm) instead "
    "of each rank's own; either way the running statistics are the same on every rank after each step.",
    example=True,
)


CHANNELS_LAST = Option(
    "channels_last",
    False,
    "Convolutional models: images and activations in channels-last memory layout (NHWC), the layout tensor cores' "
    "convolutions read directly; DDP lays out the convolution weights so too. Numerics unchanged.",
    example=True,
)


def _classifier(s: Setup) -> str | None:
    """The task, when the model is a classifier (None: another task, or not known yet)."""
    return None if s.model is None or s.model.task not in CLASSIFIERS else s.model.task


def classifier_with_model_parallelism(s: Setup) -> str | None:
    task, p = _classifier(s), s.plan
    if task is None:
        return None
    for key, value, default in split_settings(p):
        if value != default:
            return (
                f"parallel.{key}={str(value).lower()} with model.task={task} is not built yet (it splits a causal "
                f"LM's blocks, heads or sequence); train {task} with data parallelism: backend ddp, fsdp2 or "
                f"deepspeed, parallel.{key}={str(default).lower()}"
            )
    return None


def classifier_with_block_transforms(s: Setup) -> str | None:
    task, p, t = _classifier(s), s.plan, s.train
    if task is None:
        return None
    if p.activation_checkpointing != "none" and s.model is not None and s.model.batch_norm:
        return (
            f"parallel.activation_checkpointing={p.activation_checkpointing} with {s.model.model_type}: recomputing "
            "a BatchNorm's forward in backward would update its running statistics a second time; set "
            "parallel.activation_checkpointing=none (models without BatchNorm, such as ViT and BERT, take it)"
        )
    if t.compile is True and s.model is not None and s.model.batch_norm:
        return (
            f"train.compile=true with {s.model.model_type} is not built yet: compiling the data-parallel BatchNorm "
            "is not tried; set train.compile=false (models without BatchNorm, such as ViT and BERT, take it)"
        )
    return first_unbuilt(
        task,
        (
            ("parallel.offload_activations", "true", p.offload_activations, "false"),
            ("train.fp8", t.fp8, t.fp8 not in ("none", "auto"), "none"),
            ("train.method", t.method, t.method not in ("full", "auto", "lora"), "full (or lora)"),
        ),
    )


def sync_batchnorm_without_batchnorm(s: Setup) -> str | None:
    if s.model is None or s.model.batch_norm or not SYNC_BATCHNORM.of(s.plan):
        return None
    return (
        f"parallel.sync_batchnorm=true, but {s.model.model_type} has no BatchNorm layer (its normalisation does not "
        "depend on how a batch is split); leave parallel.sync_batchnorm=false"
    )


def channels_last_without_convolutions(s: Setup) -> str | None:
    if s.model is None or s.model.convolutional or not CHANNELS_LAST.of(s.plan):
        return None
    return (
        f"parallel.channels_last=true, but {s.model.model_type} has no 2-D convolution (the layout changes nothing "
        "in it); leave parallel.channels_last=false"
    )


CAPABILITY = Capability(
    name="classification",
    summary="image and sequence classifiers (model.task): BatchNorm synchronised or not, channels-last layout",
    keys=("model.task", "data.label_field", "data.image_field", "data.image_size", "data.augment"),
    rules=(
        row(classifier_with_model_parallelism, "not_built", reads_model=True),
        row(classifier_with_block_transforms, "not_built", reads_model=True, reads_micro_batch=True),
        row(sync_batchnorm_without_batchnorm, "invalid", reads_model=True),
        row(channels_last_without_convolutions, "invalid", reads_model=True),
    ),
    options=(SYNC_BATCHNORM, CHANNELS_LAST),
    transforms=("batch_norm", "channels_last"),
)
