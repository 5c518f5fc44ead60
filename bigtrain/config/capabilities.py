"""What runs together: one table of every rule "X cannot combine with Y / X needs Z", asked by every consumer.

Each row of ``RULES`` is one function of a :class:`Setup` (the plan, the recipe's ``train`` options, and the
model's facts once they are known) that returns the one line a user gets when the row trips (naming the recipe key
and what would work), or None. Recipe resolution (``config/resolve.py``), start-up (``train/run.py``), the planner's
search and ``plan: auto`` (``planner/search.py``), the simulator and ``bigtrain export`` all ask ``problems`` or
``check``, so they refuse the same setups with the same words. ``tests/unit/test_capabilities.py`` trips every row
through every consumer.

A row has a kind, which is what the planner makes of it:
- ``invalid``: the plan contradicts itself (ddp with dp_shard > 1); the planner never proposes one.
- ``fit``: the plan does not fit this model or this batch (tp does not divide the heads); shown as rejected.
- ``not_built``: the trainer cannot run it yet (cp with pp); ``bigtrain plan --all`` predicts it anyway.
Rows that read the model are skipped while its facts are unknown (recipe resolution runs before the model is read);
start-up asks again with them.

Adding a capability (a new transform, a train option such as ``train.compile``) adds its rows here (the rows about
train-level options live in ``option_rules.py``; what every row looks at, the ``Setup``, in ``setup.py``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from bigtrain.config.expert_rules import (
    ep_divides_dp_shard,
    ep_divides_experts,
    ep_needs_experts,
    ep_needs_fsdp2,
    ep_with_tp_pp_or_cp,
)
from bigtrain.config.fp8_rules import fp8_with_adapters, fp8_with_deepspeed, fp8_with_tp_or_pp
from bigtrain.config.hf import PLAIN_TP_STYLES, REFUSED_TP_STYLES, TP_STYLES
from bigtrain.config.model_facts import ModelFacts
from bigtrain.config.option_rules import (
    adapters_with_pp,
    adapters_with_tp,
    chunked_loss_keeps_logit_transform,
    chunked_loss_with_pp,
    chunked_loss_with_tp,
    compile_with_deepspeed,
    offload_activations_with_pp,
    offload_activations_with_selective,
    qlora_computes_in_bf16,
    qlora_fsdp2_shards,
    qlora_with_deepspeed,
    router_loss_with_pp_or_cp,
)
from bigtrain.config.pipeline import (
    MULTI_STAGE_SCHEDULES,
    SINGLE_STAGE_SCHEDULES,
    V_SHAPED_SCHEDULES,
    min_micro_batches,
    num_stages,
)
from bigtrain.config.plan import (
    CHOOSES_GRAD_REDUCE,
    DEFAULT_GRAD_REDUCE,
    SPLIT_BACKWARD_SCHEDULES,
    ZERO_STAGES,
    divisor_hint,
    multiples_hint,
)
from bigtrain.config.setup import Setup
from bigtrain.errors import ConfigError

Kind = Literal["invalid", "fit", "not_built"]


@dataclass(frozen=True)
class Rule:
    name: str
    kind: Kind
    reads_model: bool
    says: Callable[[Setup], str | None]  # the message when the row trips, else None


@dataclass(frozen=True)
class Problem:
    rule: Rule
    message: str


# ---- the plan contradicts itself (invalid) ------------------------------------------------------------------------
def _zero_stage_of_backend(s: Setup) -> str | None:
    p = s.plan
    if p.zero_stage in ZERO_STAGES[p.backend]:
        return None
    meaning = {
        "ddp": "ddp replicates everything: unset it or use 0",
        "fsdp2": "use 3 (reshard after forward) or 2 (keep parameters unsharded until backward ends)",
        "deepspeed": "use 1, 2 or 3",
    }[p.backend]
    return f"parallel.zero_stage={p.zero_stage} is not a mode of backend {p.backend}; {meaning}"


def _ddp_does_not_shard(s: Setup) -> str | None:
    if s.plan.backend == "ddp" and s.plan.dp_shard > 1:
        return (
            f"parallel.dp_shard={s.plan.dp_shard} shards parameters, which backend ddp does not do; unset it (ddp "
            "replicates over parallel.dp_replicate) or use backend fsdp2"
        )
    return None


def _hybrid_sharding_is_fsdp2(s: Setup) -> str | None:
    if s.plan.backend == "deepspeed" and s.plan.dp_replicate > 1:
        return (
            f"parallel.dp_replicate={s.plan.dp_replicate} (hybrid sharding) is an fsdp2 layout; deepspeed shards over "
            "the whole data-parallel world: unset it"
        )
    return None


def _offload_params_needs_sharding(s: Setup) -> str | None:
    if s.plan.offload_params and s.plan.backend == "ddp":
        return "parallel.offload_params=true needs a sharded backend; use backend fsdp2"
    return None


def _offload_optimizer_needs_deepspeed(s: Setup) -> str | None:
    p = s.plan
    if not p.offload_optimizer or p.backend == "deepspeed":
        return None
    if p.backend == "fsdp2":
        return (
            "parallel.offload_optimizer=true needs backend deepspeed (ZeRO-Offload); backend fsdp2 offloads "
            "parameters with their optimizer states: use offload_params=true"
        )
    return f"parallel.offload_optimizer=true needs backend deepspeed (ZeRO-Offload), not {p.backend}"


def _deepspeed_offloads_parameters_in_zero3(s: Setup) -> str | None:
    p = s.plan
    if p.backend == "deepspeed" and p.offload_params and p.zero_stage != 3:
        return (
            f"parallel.offload_params=true with backend deepspeed needs zero_stage=3 (ZeRO-3 offload_param), not "
            f"{p.zero_stage}; or offload only the optimizer (offload_optimizer=true)"
        )
    return None


def _grad_reduce_of_backend(s: Setup) -> str | None:
    p = s.plan
    default = DEFAULT_GRAD_REDUCE[p.backend]
    if p.pp == 1 and p.backend not in CHOOSES_GRAD_REDUCE and p.grad_reduce != default:
        return (
            f"parallel.grad_reduce={p.grad_reduce} is not a mode of backend {p.backend}, which reduces {default}: "
            "unset it"
        )
    return None


def _pipeline_reduces_once(s: Setup) -> str | None:
    p = s.plan
    if p.pp > 1 and p.grad_reduce != "once_per_step":
        return (
            f"parallel.grad_reduce={p.grad_reduce} is not possible with parallel.pp={p.pp}: pipeline stages reduce "
            "gradients once, after the step's last micro-batch; unset it"
        )
    return None


def _loss_parallel_needs_tp(s: Setup) -> str | None:
    if s.plan.loss_parallel and s.plan.tp == 1:
        return "parallel.loss_parallel=true shards the logits over the tp ranks; it needs parallel.tp > 1"
    return None


def _sequence_parallel_needs_tp(s: Setup) -> str | None:
    if s.plan.sequence_parallel and s.plan.tp == 1:
        return "parallel.sequence_parallel=true splits the sequence over the tp ranks; it needs parallel.tp > 1"
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


# ---- the trainer cannot run it yet (not_built) --------------------------------------------------------------------
def _tp_needs_fsdp2(s: Setup) -> str | None:
    if s.plan.tp > 1 and s.plan.backend != "fsdp2":
        return f"parallel.tp={s.plan.tp} runs with backend fsdp2 (tensor parallel inside, FSDP2 over the data axes)"
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


def _loss_parallel_with_pp(s: Setup) -> str | None:
    if s.plan.loss_parallel and s.plan.pp > 1:
        return "parallel.loss_parallel=true is not supported with parallel.pp > 1 yet; set one of them back"
    return None


def _sequence_parallel_with_pp(s: Setup) -> str | None:
    if s.plan.sequence_parallel and s.plan.pp > 1:
        return "parallel.sequence_parallel=true is not supported with parallel.pp > 1 yet; set one of them back"
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


# ---- the plan does not fit this model or batch (fit) --------------------------------------------------------------
def _batch_splits_into_micro_batches(s: Setup) -> str | None:
    p, batch = s.plan, s.train.global_batch_size
    unit = p.micro_batch_size * p.dp
    if batch < 1 or batch % unit:
        return (
            f"train.global_batch_size={batch} is not a multiple of parallel.micro_batch_size={p.micro_batch_size} x "
            f"data-parallel degree {p.dp} = {unit}; try {multiples_hint(unit, batch)}"
        )
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


def _heads_not_divided(s: Setup, key: str, why: str = "") -> str | None:
    """The line for parallel.<key> (tp or cp) not dividing the attention or KV heads, or None."""
    model, degree = s.model, getattr(s.plan, key)
    assert model is not None
    for name, n in (("num_attention_heads", model.heads), ("num_key_value_heads", model.kv_heads)):
        if n % degree:
            fits_both = divisor_hint(math.gcd(model.heads, model.kv_heads))  # what divides both divides their gcd
            return f"parallel.{key}={degree} does not divide {name}={n}{why}; try {fits_both}"
    return None


def _tp_divides_heads(s: Setup) -> str | None:
    return _heads_not_divided(s, "tp")


def _cp_divides_heads(s: Setup) -> str | None:
    return _heads_not_divided(s, "cp", " (each cp rank attends over 1/cp of them)")


def _cp_backends(s: Setup) -> str | None:
    if s.plan.cp > 1 and s.plan.backend == "deepspeed":
        return f"parallel.cp={s.plan.cp} with backend deepspeed is not built yet; use backend fsdp2 (or ddp)"
    return None


def _cp_with_tp_or_pp(s: Setup) -> str | None:
    if s.plan.cp > 1 and (s.plan.tp > 1 or s.plan.pp > 1):
        other = f"parallel.tp={s.plan.tp}" if s.plan.tp > 1 else f"parallel.pp={s.plan.pp}"
        return f"parallel.cp={s.plan.cp} with {other} is not built yet; set one of them back to 1"
    return None


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


def _row(says: Callable[[Setup], str | None], kind: Kind, reads_model: bool = False) -> Rule:
    return Rule(says.__name__.lstrip("_"), kind, reads_model, says)


# The table, in the order its rows are asked (the first that trips is the one a user sees).
RULES: tuple[Rule, ...] = (
    _row(_zero_stage_of_backend, "invalid"),
    _row(_ddp_does_not_shard, "invalid"),
    _row(_hybrid_sharding_is_fsdp2, "invalid"),
    _row(_offload_params_needs_sharding, "invalid"),
    _row(_deepspeed_offloads_parameters_in_zero3, "invalid"),
    _row(_offload_optimizer_needs_deepspeed, "invalid"),
    _row(_grad_reduce_of_backend, "invalid"),
    _row(_pipeline_reduces_once, "invalid"),
    _row(_loss_parallel_needs_tp, "invalid"),
    _row(_sequence_parallel_needs_tp, "invalid"),
    _row(_virtual_stages_need_pp, "invalid"),
    _row(_single_stage_schedules, "invalid"),
    _row(_v_shaped_schedules, "invalid"),
    _row(_tp_needs_fsdp2, "not_built"),
    _row(_pp_needs_fsdp2, "not_built"),
    _row(_split_backward_schedules, "not_built"),
    _row(_loss_parallel_with_pp, "not_built"),
    _row(_sequence_parallel_with_pp, "not_built"),
    _row(compile_with_deepspeed, "not_built"),
    _row(_cp_backends, "not_built"),
    _row(_cp_with_tp_or_pp, "not_built"),
    _row(chunked_loss_with_tp, "not_built"),
    _row(chunked_loss_with_pp, "not_built"),
    _row(chunked_loss_keeps_logit_transform, "not_built", reads_model=True),
    _row(offload_activations_with_selective, "not_built"),
    _row(offload_activations_with_pp, "not_built"),
    _row(router_loss_with_pp_or_cp, "not_built", reads_model=True),
    _row(fp8_with_deepspeed, "not_built"),
    _row(fp8_with_tp_or_pp, "not_built"),
    _row(fp8_with_adapters, "not_built"),
    _row(ep_needs_fsdp2, "not_built"),
    _row(ep_with_tp_pp_or_cp, "not_built"),
    _row(qlora_computes_in_bf16, "invalid"),
    _row(adapters_with_tp, "not_built"),
    _row(adapters_with_pp, "not_built"),
    _row(qlora_with_deepspeed, "not_built"),
    _row(_batch_splits_into_micro_batches, "fit"),
    _row(ep_divides_dp_shard, "fit"),
    _row(ep_needs_experts, "fit", reads_model=True),
    _row(ep_divides_experts, "fit", reads_model=True),
    _row(qlora_fsdp2_shards, "fit"),
    _row(_tp_layout_shipped, "fit", reads_model=True),
    _row(_tp_style_not_mapped, "not_built", reads_model=True),
    _row(_sequence_parallel_plain_layout, "not_built", reads_model=True),
    _row(_tp_divides_heads, "fit", reads_model=True),
    _row(_cp_divides_heads, "fit", reads_model=True),
    _row(_loss_parallel_untied, "fit", reads_model=True),
    _row(_loss_parallel_divides_vocab, "fit", reads_model=True),
    _row(_pp_layout_shipped, "fit", reads_model=True),
    _row(_pp_untied, "fit", reads_model=True),
    _row(_pp_stages_within_layers, "fit", reads_model=True),
    _row(_interleaved_rounds, "fit"),
    _row(_pp_enough_micro_batches, "fit"),
)


@functools.cache
def _rules(kinds: tuple[Kind, ...], model_known: bool) -> tuple[Rule, ...]:
    """The rows of these kinds that can be asked (the planner asks tens of thousands of plans: filtered once)."""
    return tuple(rule for rule in RULES if rule.kind in kinds and (model_known or not rule.reads_model))


def problems(setup: Setup, kinds: tuple[Kind, ...] = ("invalid", "fit", "not_built")) -> Iterator[Problem]:
    """Every row of the given ``kinds`` that trips for ``setup``, in table order (rows that read the model only once
    it is known)."""
    for rule in _rules(kinds, setup.model is not None):
        message = rule.says(setup)
        if message is not None:
            yield Problem(rule, message)


def first_problem(setup: Setup, kinds: tuple[Kind, ...] = ("invalid", "fit", "not_built")) -> Problem | None:
    return next(problems(setup, kinds), None)


def check(setup: Setup, kinds: tuple[Kind, ...] = ("invalid", "fit", "not_built")) -> None:
    """Raise the first tripped row's message as a ConfigError (what a recipe gets at resolution and start-up)."""
    problem = first_problem(setup, kinds)
    if problem is not None:
        raise ConfigError(problem.message)
