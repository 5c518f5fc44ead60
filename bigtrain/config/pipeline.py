"""Pipeline parallelism as arithmetic: which decoder layers each stage holds, which stages each pp rank runs, and
the checks a pipelined plan must pass before any process group exists (pure Python, shared by the trainer, the
validator and the planner).

Stages: ``pp x pp_virtual_stages`` contiguous runs of decoder layers (the first stage also holds the embeddings,
the last the final norm, the head and the loss). Single-stage schedules (gpipe, 1f1b) give each pp rank one stage;
the looped multi-stage schedules give rank r the stages r, r + pp, r + 2pp, ...; the V-shaped ones (zbv_zero_bubble,
dual_pipe_v) give rank r the stages r and 2pp - 1 - r, so that the first and the last stage share a rank.
"""

from __future__ import annotations

from typing import Any

from bigtrain.config.plan import Plan
from bigtrain.errors import ConfigError

# bigtrain's schedule names -> torch.distributed.pipelining's (get_schedule_class)
TORCH_SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved_1f1b": "Interleaved1F1B",
    "looped_bfs": "LoopedBFS",
    "interleaved_zero_bubble": "InterleavedZeroBubble",
    "zbv_zero_bubble": "ZBVZeroBubble",
    "dual_pipe_v": "DualPipeV",
}
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b")
V_SHAPED_SCHEDULES = ("zbv_zero_bubble", "dual_pipe_v")
MULTI_STAGE_SCHEDULES = tuple(s for s in TORCH_SCHEDULES if s not in SINGLE_STAGE_SCHEDULES)


def num_stages(plan: Plan) -> int:
    return plan.pp * plan.pp_virtual_stages


def stage_layer_ranges(num_layers: int, stages: int) -> list[range]:
    """Contiguous decoder layers per stage, as even as possible; the first stages take the remainder (the last
    stage already carries the head and the loss)."""
    base, extra = divmod(num_layers, stages)
    ranges, start = [], 0
    for s in range(stages):
        size = base + (s < extra)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def stages_of_rank(pp_rank: int, plan: Plan) -> list[int]:
    """The stage indices pp rank ``pp_rank`` runs, in increasing order."""
    if plan.pp_schedule in V_SHAPED_SCHEDULES:
        return sorted({pp_rank, 2 * plan.pp - 1 - pp_rank})
    return [pp_rank + v * plan.pp for v in range(plan.pp_virtual_stages)]


def min_micro_batches(plan: Plan) -> int:
    """The fewest micro-batches per step the plan's schedule accepts (torch's Schedule1F1B and ScheduleDualPipeV
    refuse fewer than their stages)."""
    if plan.pp == 1:
        return 1
    return {"1f1b": plan.pp, "dual_pipe_v": num_stages(plan)}.get(plan.pp_schedule, 1)


def check_pipeline_parallel(hf_config: Any, plan: Plan, global_batch_size: int) -> None:
    """Everything about a pp plan that can be wrong, named by its recipe key (on every rank, before any group)."""
    if plan.pp == 1:
        if plan.pp_virtual_stages != 1:
            raise ConfigError(f"parallel.pp_virtual_stages={plan.pp_virtual_stages} needs parallel.pp > 1")
        return
    schedule, virtual = plan.pp_schedule, plan.pp_virtual_stages
    if schedule in SINGLE_STAGE_SCHEDULES and virtual != 1:
        raise ConfigError(
            f"parallel.pp_virtual_stages={virtual} needs a multi-stage schedule ({', '.join(MULTI_STAGE_SCHEDULES)}); "
            f"parallel.pp_schedule={schedule} runs one stage per rank: set pp_virtual_stages=1"
        )
    if schedule in V_SHAPED_SCHEDULES and virtual != 2:
        raise ConfigError(
            f"parallel.pp_schedule={schedule} runs exactly two stages per rank (a V): set parallel.pp_virtual_stages=2"
        )
    layout = getattr(hf_config, "base_model_pp_plan", None) or {}
    if not {"embed_tokens", "layers", "norm"} <= set(layout):
        raise ConfigError(
            f"parallel.pp > 1: model_type {hf_config.model_type!r} ships no pipeline layout (base_model_pp_plan with "
            "embed_tokens, layers, norm) in transformers; pipeline parallelism supports llama, mistral, qwen2 and "
            "their relatives: use parallel.pp=1"
        )
    if getattr(hf_config, "tie_word_embeddings", False):
        raise ConfigError(
            f"parallel.pp={plan.pp}: this {hf_config.model_type} model ties its LM head to its embeddings "
            "(tie_word_embeddings=true), and pipeline stages put them on different ranks; use parallel.pp=1 "
            "(tensor and data parallelism work with tied weights)"
        )
    layers = hf_config.num_hidden_layers
    stages = num_stages(plan)
    if stages > layers:
        raise ConfigError(
            f"parallel.pp={plan.pp} x parallel.pp_virtual_stages={virtual} = {stages} stages exceeds the model's "
            f"{layers} decoder layers (num_hidden_layers), and every stage needs at least one; use pp x "
            f"pp_virtual_stages <= {layers}"
        )
    accum = plan.grad_accum_steps(global_batch_size)
    needed = min_micro_batches(plan)
    if schedule in ("interleaved_1f1b", "interleaved_zero_bubble"):
        rounds = max(1, accum // plan.pp)
        if accum % rounds:
            raise ConfigError(
                f"parallel.pp_schedule={schedule} splits the step's {accum} micro-batches (global_batch_size / "
                f"(micro_batch_size x dp)) into rounds of pp={plan.pp}, and {accum} is not a multiple of its "
                f"{rounds} rounds; use a multiple of pp={plan.pp} micro-batches (or at most pp)"
            )
    if accum < needed:
        raise ConfigError(
            f"parallel.pp_schedule={schedule} needs at least {needed} micro-batches per step, but "
            f"train.global_batch_size={global_batch_size} / (parallel.micro_batch_size={plan.micro_batch_size} x "
            f"dp={plan.dp}) gives {accum}; raise the global batch to {needed * plan.micro_batch_size * plan.dp} or "
            "use pp_schedule=gpipe"
        )
