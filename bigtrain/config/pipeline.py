"""Pipeline parallelism as arithmetic: which decoder layers each stage holds and which stages each pp rank runs
(pure Python, shared by the trainer, the capability table and the planner).

Stages: ``pp x pp_virtual_stages`` contiguous runs of decoder layers (the first stage also holds the embeddings,
the last the final norm, the head and the loss). Single-stage schedules (gpipe, 1f1b) give each pp rank one stage;
the looped multi-stage schedules give rank r the stages r, r + pp, r + 2pp, ...; the V-shaped ones (zbv_zero_bubble,
dual_pipe_v) give rank r the stages r and 2pp - 1 - r, so that the first and the last stage share a rank.
"""

from __future__ import annotations

from bigtrain.config.plan import Plan

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
