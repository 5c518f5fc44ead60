"""The chunked loss (``parallel.loss_chunk_tokens``): the LM head and cross-entropy over chunks of tokens, recomputed in
backward, so a long row's logits never exist whole."""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, Plan, SearchSpace, row
from bigtrain.config.schema import ADAPTER_METHODS
from bigtrain.config.setup import Setup

# parallel.loss_chunk_tokens the search offers: a chunk's logits at a 128k vocabulary are 6 GiB in fp32 (12 bytes per
# logit for the loss backward), against 49 GiB for one 32k-token sequence's; the recomputed head costs the same
# FLOPs whatever the chunk size, and smaller chunks only add launches
LOSS_CHUNK_TOKENS = 4096


def chunked_loss_with_tp(s: Setup) -> str | None:
    if s.plan.loss_chunk_tokens and s.plan.tp > 1:
        return (
            f"parallel.loss_chunk_tokens={s.plan.loss_chunk_tokens} with parallel.tp > 1 is not built yet; under tp, "
            "parallel.loss_parallel=true divides the logits over the tp ranks instead"
        )
    return None


def chunked_loss_with_pp(s: Setup) -> str | None:
    if s.plan.loss_chunk_tokens and s.plan.pp > 1:
        return f"parallel.loss_chunk_tokens={s.plan.loss_chunk_tokens} with parallel.pp > 1 is not built yet"
    return None


def chunked_loss_keeps_logit_transform(s: Setup) -> str | None:
    key = s.model.logits_after_head
    if s.plan.loss_chunk_tokens and key is not None:
        return (
            f"parallel.loss_chunk_tokens: this model's forward applies {key} to the logits after the LM head, which "
            "a chunked loss would skip; set parallel.loss_chunk_tokens=0"
        )
    return None


def chunked_loss_with_adapters_on_zero3(s: Setup) -> str | None:
    # found by the pair test (tests/pairs.py): DeepSpeed's ZeRO-3 hooks gather a frozen head's weight for the chunk's
    # forward but not when the checkpoint recomputes the chunk in backward, which then finds it partitioned
    if s.plan.loss_chunk_tokens and s.plan.backend == "deepspeed" and s.plan.zero_stage == 3:
        if s.train.method in ADAPTER_METHODS:
            return (
                f"parallel.loss_chunk_tokens={s.plan.loss_chunk_tokens} with train.method={s.train.method} on "
                "DeepSpeed ZeRO-3 is not built yet (the frozen LM head is not gathered when a chunk is recomputed); "
                "use backend=fsdp2, zero_stage 1 or 2, or parallel.loss_chunk_tokens=0"
            )
    return None


def _chunked(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    """Weighed for rows longer than a chunk (shorter rows can shrink the micro-batch instead), or as pinned."""
    chunk = space.fixed.get("loss_chunk_tokens", LOSS_CHUNK_TOKENS)
    if not chunk:
        return plans
    pinned = space.pinned("loss_chunk_tokens")
    return plans + [p.but(loss_chunk_tokens=chunk) for p in plans if pinned or space.seq_len // p.cp > chunk]


CAPABILITY = Capability(
    name="chunked_loss",
    summary="the LM head and cross-entropy over chunks of tokens, recomputed in backward",
    keys=("parallel.loss_chunk_tokens",),
    rules=(
        row(chunked_loss_with_tp, "not_built"),
        row(chunked_loss_with_pp, "not_built"),
        row(chunked_loss_keeps_logit_transform, "not_built", reads_model=True),
        row(chunked_loss_with_adapters_on_zero3, "not_built"),
    ),
    variants=_chunked,
    transforms=("chunked_loss",),
)
