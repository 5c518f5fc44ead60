"""Tensor parallelism (``parallel.tp``) with transformers' ``base_model_tp_plan``, and its companions: the LM head and
loss split over the vocabulary (``loss_parallel``) and the norms and residual stream over the sequence
(``sequence_parallel``)."""

from __future__ import annotations

import math

from bigtrain.config.capabilities.table import Capability, Plan, SearchSpace, row, with_pins
from bigtrain.config.hf import PLAIN_TP_STYLES, REFUSED_TP_STYLES, TP_STYLES
from bigtrain.config.model_facts import ModelFacts
from bigtrain.config.plan import divisor_hint
from bigtrain.config.setup import Setup


def _loss_parallel_needs_tp(s: Setup) -> str | None:
    if s.plan.loss_parallel and s.plan.tp == 1:
        return "parallel.loss_parallel=true shards the logits over the tp ranks; it needs parallel.tp > 1"
    return None


def _sequence_parallel_needs_tp(s: Setup) -> str | None:
    if s.plan.sequence_parallel and s.plan.tp == 1:
        return "parallel.sequence_parallel=true splits the sequence over the tp ranks; it needs parallel.tp > 1"
    return None


def _tp_needs_fsdp2(s: Setup) -> str | None:
    if s.plan.tp > 1 and s.plan.backend != "fsdp2":
        return f"parallel.tp={s.plan.tp} runs with backend fsdp2 (tensor parallel inside, FSDP2 over the data axes)"
    return None


def _loss_parallel_with_pp(s: Setup) -> str | None:
    if s.plan.loss_parallel and s.plan.pp > 1:
        return "parallel.loss_parallel=true is not supported with parallel.pp > 1 yet; set one of them back"
    return None


def _sequence_parallel_with_pp(s: Setup) -> str | None:
    if s.plan.sequence_parallel and s.plan.pp > 1:
        return "parallel.sequence_parallel=true is not supported with parallel.pp > 1 yet; set one of them back"
    return None


def _no_tp_layout(model: ModelFacts, why: str) -> str:
    return (
        f"parallel.tp > 1: model_type {model.model_type!r} {why} in transformers' base_model_tp_plan; tensor "
        f"parallelism maps the styles {', '.join(TP_STYLES)}: use parallel.tp=1"
    )


def _tp_layout_shipped(s: Setup) -> str | None:
    assert s.model is not None
    if s.plan.tp > 1 and not s.model.tp_styles:
        return _no_tp_layout(s.model, "ships no tensor-parallel layout")
    return None


def _tp_style_not_mapped(s: Setup) -> str | None:
    model = s.model
    assert model is not None
    others = [style for style in model.tp_styles if style not in TP_STYLES]
    if s.plan.tp > 1 and model.tp_styles and others:
        why = "; ".join(f"{style}: {REFUSED_TP_STYLES.get(style, 'unknown to bigtrain')}" for style in others)
        return _no_tp_layout(model, f"uses the style(s) {', '.join(others)} ({why})")
    return None


def _sequence_parallel_plain_layout(s: Setup) -> str | None:
    model = s.model
    assert model is not None
    others = [style for style in model.tp_styles if style not in PLAIN_TP_STYLES]
    if s.plan.sequence_parallel and s.plan.tp > 1 and others:
        return (
            f"parallel.sequence_parallel=true with model_type {model.model_type!r} is not built yet: its layout uses "
            f"{', '.join(others)}, and sequence parallelism is built for colwise/rowwise layouts; set "
            "parallel.sequence_parallel=false"
        )
    return None


def heads_not_divided(s: Setup, key: str, why: str = "") -> str | None:
    """The line for parallel.<key> (tp or cp) not dividing the attention or KV heads, or None."""
    model, degree = s.model, getattr(s.plan, key)
    assert model is not None
    for name, n in (("num_attention_heads", model.heads), ("num_key_value_heads", model.kv_heads)):
        if n % degree:
            fits_both = divisor_hint(math.gcd(model.heads, model.kv_heads))  # what divides both divides their gcd
            return f"parallel.{key}={degree} does not divide {name}={n}{why}; try {fits_both}"
    return None


def _tp_divides_heads(s: Setup) -> str | None:
    return heads_not_divided(s, "tp")


def _loss_parallel_untied(s: Setup) -> str | None:
    assert s.model is not None
    if s.plan.loss_parallel and s.model.tied:
        return (
            "parallel.loss_parallel=true shards the LM head over the vocabulary, but this model ties it to the "
            "input embeddings (tie_word_embeddings=true), which stay whole; set parallel.loss_parallel=false"
        )
    return None


def _loss_parallel_divides_vocab(s: Setup) -> str | None:
    model, tp = s.model, s.plan.tp
    assert model is not None
    if s.plan.loss_parallel and model.vocab % tp:
        return (
            f"parallel.loss_parallel=true: parallel.tp={tp} does not divide vocab_size={model.vocab}; use a tp in "
            f"{divisor_hint(math.gcd(model.vocab, 1 << 20))} or pad the vocabulary to a multiple of {tp}"
        )
    return None


def _companions(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    """What torchtitan runs with tp wherever the model allows it, as the rows say: the LM head and loss split over
    the vocabulary, then the norms and residual stream over the sequence. Both save memory and time in the model
    (``planner/tp_time.py``); weighing each both ways would cost the search a third more tp plans. A pin overrides.
    Decided once per layout (``SearchSpace.per_layout``): what else differs among its plans (micro-batch,
    checkpointing, offload) trips a row with or without them."""

    def decide(plan: Plan) -> dict[str, bool]:
        chosen: dict[str, bool] = {}
        for key in ("loss_parallel", "sequence_parallel"):
            base = plan.but(**chosen)
            if space.rides_along(base, base.but(**{key: True})):
                chosen[key] = True
        return chosen

    out = []
    for plan in plans:
        if plan.tp > 1:
            chosen = space.per_layout("tp_companions", plan, decide)
            plan = plan.but(**chosen) if chosen else plan
        out.append(plan)
    return with_pins(out, space, "loss_parallel", "sequence_parallel")


CAPABILITY = Capability(
    name="tensor_parallel",
    # sequence parallelism splits the sequence over the tp ranks
    length_multiple=lambda plan, train: plan.tp if plan.sequence_parallel else 1,
    summary="tensor parallelism from transformers' base_model_tp_plan, with vocabulary-parallel loss and sequence "
    "parallelism",
    keys=("parallel.tp", "parallel.loss_parallel", "parallel.sequence_parallel"),
    rules=(
        row(_loss_parallel_needs_tp, "invalid"),
        row(_sequence_parallel_needs_tp, "invalid"),
        row(_tp_needs_fsdp2, "not_built"),
        row(_loss_parallel_with_pp, "not_built"),
        row(_sequence_parallel_with_pp, "not_built"),
        row(_tp_layout_shipped, "fit", reads_model=True),
        row(_tp_style_not_mapped, "not_built", reads_model=True),
        row(_sequence_parallel_plain_layout, "not_built", reads_model=True),
        row(_tp_divides_heads, "fit", reads_model=True),
        row(_loss_parallel_untied, "fit", reads_model=True),
        row(_loss_parallel_divides_vocab, "fit", reads_model=True),
    ),
    variants=_companions,
    transforms=("tensor_parallel",),
)
