"""BatchNorm across data-parallel ranks (``parallel.sync_batchnorm``): the one layer whose output depends on how a
batch is split over ranks and micro-steps (``parallel/transforms/batch_norm.py`` runs it).

Every model with BatchNorm gets the step: its BatchNorms compute in fp32 and normalise by their own rank's images
(running statistics averaged over the data-parallel ranks after each step), or with ``sync_batchnorm`` by every
data-parallel rank's images of the micro-step together. Checkpointing a block with BatchNorm would update its
running statistics twice (its forward runs again in backward), and compiling it is not tried: both are rows here,
whatever the task.
"""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, ModelStep, Option, row
from bigtrain.config.setup import Setup

SYNC_BATCHNORM = Option(
    "sync_batchnorm",
    False,
    "BatchNorm statistics of a micro-step over every data-parallel rank's images together (SyncBatchNorm) instead "
    "of each rank's own; either way the running statistics are the same on every rank after each step.",
    example=True,
)


def sync_batchnorm_without_batchnorm(s: Setup) -> str | None:
    if s.model is None or s.model.batch_norm or not SYNC_BATCHNORM.of(s.plan):
        return None
    return (
        f"parallel.sync_batchnorm=true, but {s.model.model_type} has no BatchNorm layer (its normalisation does not "
        "depend on how a batch is split); leave parallel.sync_batchnorm=false"
    )


def batchnorm_recomputed(s: Setup) -> str | None:
    if s.model is None or not s.model.batch_norm or s.plan.activation_checkpointing == "none":
        return None
    return (
        f"parallel.activation_checkpointing={s.plan.activation_checkpointing} with {s.model.model_type}: recomputing "
        "a BatchNorm's forward in backward would update its running statistics a second time; set "
        "parallel.activation_checkpointing=none (models without BatchNorm, such as ViT and BERT, take it)"
    )


def batchnorm_compiled(s: Setup) -> str | None:
    if s.model is None or not s.model.batch_norm or s.train.compile is not True:
        return None
    return (
        f"train.compile=true with {s.model.model_type} is not built yet: compiling the data-parallel BatchNorm "
        "is not tried; set train.compile=false (models without BatchNorm, such as ViT and BERT, take it)"
    )


CAPABILITY = Capability(
    name="batch_norm",
    summary="BatchNorm per rank or synchronised over the data-parallel ranks",
    rules=(
        row(sync_batchnorm_without_batchnorm, "invalid", reads_model=True),
        row(batchnorm_recomputed, "not_built", reads_model=True, reads_micro_batch=True),
        row(batchnorm_compiled, "not_built", reads_model=True),
    ),
    options=(SYNC_BATCHNORM,),
    # after activation offload (the last block wrapper), before FSDP2 and DDP wrap the model
    steps=(ModelStep("batch_norm", after="activation_offload", code="bigtrain.parallel.transforms.batch_norm"),),
)
