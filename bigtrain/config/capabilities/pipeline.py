"""Pipeline parallelism (``parallel.pp``): stages cut from transformers' ``base_model_pp_plan``, their schedules and
virtual stages."""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, row
from bigtrain.config.pipeline import (
    MULTI_STAGE_SCHEDULES,
    SINGLE_STAGE_SCHEDULES,
    V_SHAPED_SCHEDULES,
    min_micro_batches,
    num_stages,
)
from bigtrain.config.plan import SPLIT_BACKWARD_SCHEDULES
from bigtrain.config.setup import Setup


def _pipeline_reduces_once(s: Setup) -> str | None:
    p = s.plan
    if p.pp > 1 and p.grad_reduce != "once_per_step":
        return (
            f"parallel.grad_reduce={p.grad_reduce} is not possible with parallel.pp={p.pp}: pipeline stages reduce "
            "gradients once, after the step's last micro-batch; unset it"
        )
    return None


def _virtual_stages_need_pp(s: Setup) -> str | None:
    if s.plan.pp == 1 and s.plan.pp_virtual_stages != 1:
        return f"parallel.pp_virtual_stages={s.plan.pp_virtual_stages} needs parallel.pp > 1"
    return None


def _single_stage_schedules(s: Setup) -> str | None:
    p = s.plan
    if p.pp > 1 and p.pp_schedule in SINGLE_STAGE_SCHEDULES and p.pp_virtual_stages != 1:
        return (
            f"parallel.pp_virtual_stages={p.pp_virtual_stages} needs a multi-stage schedule "
            f"({', '.join(MULTI_STAGE_SCHEDULES)}); parallel.pp_schedule={p.pp_schedule} runs one stage per rank: "
            "set pp_virtual_stages=1"
        )
    return None


def _v_shaped_schedules(s: Setup) -> str | None:
    p = s.plan
    if p.pp > 1 and p.pp_schedule in V_SHAPED_SCHEDULES and p.pp_virtual_stages != 2:
        return (
            f"parallel.pp_schedule={p.pp_schedule} runs exactly two stages per rank (a V): set "
            "parallel.pp_virtual_stages=2"
        )
    return None


def _pp_needs_fsdp2(s: Setup) -> str | None:
    if s.plan.pp > 1 and s.plan.backend != "fsdp2":
        return f"parallel.pp={s.plan.pp} runs with backend fsdp2 (pipeline stages, FSDP2 over the data axes)"
    return None


def _split_backward_schedules(s: Setup) -> str | None:
    # torch's zero-bubble schedules split each backward into an input-gradient and a deferred weight-gradient pass;
    # with FSDP2 stages they train a different model here (first step: same loss, grad norm 1.2% off a
    # single-process loop; after 10 steps 27-42%), so they are refused until that is understood
    p = s.plan
    if p.pp > 1 and p.pp_schedule in SPLIT_BACKWARD_SCHEDULES:
        return (
            f"parallel.pp_schedule={p.pp_schedule} (split input/weight backward) does not train the same model as a "
            "single-process loop with FSDP2 stages in torch 2.13; use gpipe, 1f1b, interleaved_1f1b or looped_bfs"
        )
    return None


def _pp_layout_shipped(s: Setup) -> str | None:
    assert s.model is not None
    if s.plan.pp > 1 and not s.model.pp_layout:
        return (
            f"parallel.pp > 1: model_type {s.model.model_type!r} ships no pipeline layout (base_model_pp_plan with "
            "embed_tokens, layers, norm) in transformers; pipeline parallelism supports llama, mistral, qwen2 and "
            "their relatives: use parallel.pp=1"
        )
    return None


def _pp_untied(s: Setup) -> str | None:
    assert s.model is not None
    if s.plan.pp > 1 and s.model.tied:
        return (
            f"parallel.pp={s.plan.pp}: this {s.model.model_type} model ties its LM head to its embeddings "
            "(tie_word_embeddings=true), and pipeline stages put them on different ranks; use parallel.pp=1 "
            "(tensor and data parallelism work with tied weights)"
        )
    return None


def _pp_stages_within_layers(s: Setup) -> str | None:
    p, model = s.plan, s.model
    assert model is not None
    stages = num_stages(p)
    if p.pp > 1 and stages > model.layers:
        return (
            f"parallel.pp={p.pp} x parallel.pp_virtual_stages={p.pp_virtual_stages} = {stages} stages exceeds the "
            f"model's {model.layers} decoder layers (num_hidden_layers), and every stage needs at least one; use pp x "
            f"pp_virtual_stages <= {model.layers}"
        )
    return None


def _interleaved_rounds(s: Setup) -> str | None:
    p = s.plan
    if p.pp == 1 or p.pp_schedule not in ("interleaved_1f1b", "interleaved_zero_bubble"):
        return None
    accum = p.grad_accum_steps(s.train.global_batch_size)
    rounds = max(1, accum // p.pp)
    if accum % rounds:
        return (
            f"parallel.pp_schedule={p.pp_schedule} splits the step's {accum} micro-batches (global_batch_size / "
            f"(micro_batch_size x dp)) into rounds of pp={p.pp}, and {accum} is not a multiple of its {rounds} "
            f"rounds; use a multiple of pp={p.pp} micro-batches (or at most pp)"
        )
    return None


def _pp_enough_micro_batches(s: Setup) -> str | None:
    p, batch = s.plan, s.train.global_batch_size
    accum, needed = p.grad_accum_steps(batch), min_micro_batches(p)
    if p.pp > 1 and accum < needed:
        return (
            f"parallel.pp_schedule={p.pp_schedule} needs at least {needed} micro-batches per step, but "
            f"train.global_batch_size={batch} / (parallel.micro_batch_size={p.micro_batch_size} x dp={p.dp}) gives "
            f"{accum}; raise the global batch to {needed * p.micro_batch_size * p.dp} or use pp_schedule=gpipe"
        )
    return None


CAPABILITY = Capability(
    name="pipeline",
    # its stages' shapes are fixed at the first step
    one_length=lambda plan, train, hf_config: plan.pp > 1,
    summary="pipeline parallelism from transformers' base_model_pp_plan: GPipe, 1F1B, interleaved 1F1B, looped BFS",
    keys=("parallel.pp", "parallel.pp_schedule", "parallel.pp_virtual_stages"),
    rules=(
        row(_pipeline_reduces_once, "invalid"),
        row(_virtual_stages_need_pp, "invalid"),
        row(_single_stage_schedules, "invalid"),
        row(_v_shaped_schedules, "invalid"),
        row(_pp_needs_fsdp2, "not_built"),
        row(_split_backward_schedules, "not_built"),
        row(_pp_layout_shipped, "fit", reads_model=True),
        row(_pp_untied, "fit", reads_model=True),
        row(_pp_stages_within_layers, "fit", reads_model=True),
        row(_interleaved_rounds, "fit", reads_micro_batch=True),
        row(_pp_enough_micro_batches, "fit", reads_micro_batch=True),
    ),
    transforms=("pipeline_split",),
)
