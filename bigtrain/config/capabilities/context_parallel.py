"""Context parallelism (``parallel.cp``): each row's sequence split over cp ranks, with all-to-alls around the
attention; what it needs of the plan, the model's heads, the rows' length, packing and the attention kernel."""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, row
from bigtrain.config.capabilities.tensor_parallel import heads_not_divided
from bigtrain.config.setup import Setup

CP_ATTENTION = ("sdpa", "flash_attention_2", "flash_attention_3")  # causal from a flag, no mask: what cp wraps


def _cp_backends(s: Setup) -> str | None:
    if s.plan.cp > 1 and s.plan.backend == "deepspeed":
        return f"parallel.cp={s.plan.cp} with backend deepspeed is not built yet; use backend fsdp2 (or ddp)"
    return None


def _cp_with_tp_or_pp(s: Setup) -> str | None:
    if s.plan.cp > 1 and (s.plan.tp > 1 or s.plan.pp > 1):
        other = f"parallel.tp={s.plan.tp}" if s.plan.tp > 1 else f"parallel.pp={s.plan.pp}"
        return f"parallel.cp={s.plan.cp} with {other} is not built yet; set one of them back to 1"
    return None


def _cp_divides_heads(s: Setup) -> str | None:
    return heads_not_divided(s, "cp", " (each cp rank attends over 1/cp of them)")


def _cp_divides_rows(s: Setup) -> str | None:
    cp, data = s.plan.cp, s.data
    assert data is not None
    if cp > 1 and data.seq_len % cp:
        return (
            f"parallel.cp={cp} does not divide the rows' sequence length {data.seq_len}; use a sequence length that "
            f"is a multiple of {cp} (data.seq_len) or a cp that divides {data.seq_len}"
        )
    return None


def _cp_with_packed_documents(s: Setup) -> str | None:
    assert s.data is not None
    if s.plan.cp > 1 and s.data.packed:
        return (
            f"parallel.cp={s.plan.cp} with packed documents (data.packing: documents) is not built yet: the attention "
            "cp wraps runs causal over the whole row, across the records; use data.packing: stream or parallel.cp=1"
        )
    return None


def _cp_attention(s: Setup) -> str | None:
    assert s.data is not None
    if s.plan.cp > 1 and s.data.attention not in CP_ATTENTION:
        return (
            f"parallel.cp={s.plan.cp} wraps attention that is causal by a flag over the whole sequence; "
            f"model.attn_implementation={s.data.attention} is not one of them: use {' or '.join(CP_ATTENTION)}"
        )
    return None


CAPABILITY = Capability(
    name="context_parallel",
    # each row is split in equal slices over the cp ranks
    one_length=lambda plan, train, hf_config: plan.cp > 1,
    summary="context parallelism: each row's sequence split over cp ranks, all-to-all around the attention",
    keys=("parallel.cp",),
    rules=(
        row(_cp_backends, "not_built"),
        row(_cp_with_tp_or_pp, "not_built"),
        row(_cp_with_packed_documents, "not_built", reads_data=True),
        row(_cp_attention, "not_built", reads_data=True),
        row(_cp_divides_heads, "fit", reads_model=True),
        row(_cp_divides_rows, "fit", reads_data=True),
    ),
    transforms=("context_parallel",),
)
