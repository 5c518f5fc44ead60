"""The ``Plan``: a frozen description of how one job is parallelised, its resolution from a recipe, and what the
trainer can run of it.

Pure Python on purpose (no ``torch``): the planner, the trainer and the tests reason about plans without processes.
``resolve_plan`` fills derived degrees, checks that they multiply to the world size and that the global batch splits
into whole micro-batches; ``unsupported`` is the one place that says what the trainer cannot run yet, asked by
``resolve_plan``, by the planner's search and by the simulator alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from bigtrain.config.schema import ParallelConfig
from bigtrain.errors import ConfigError

ZERO_STAGES = {"ddp": (0,), "fsdp2": (2, 3), "deepspeed": (1, 2, 3)}
# How each backend reduces gradients during accumulation when the recipe leaves grad_reduce unset; only fsdp2 may
# choose the other mode. DDP reduces in its backward hooks, and reducing inner micro-steps would cost accum x the
# traffic for nothing (its gradients are unsharded either way); DeepSpeed ZeRO-2/3 reduces every micro-step and
# refuses no_sync.
DEFAULT_GRAD_REDUCE = {"ddp": "once_per_step", "fsdp2": "every_micro_step", "deepspeed": "every_micro_step"}
CHOOSES_GRAD_REDUCE = ("fsdp2",)
# torch's zero-bubble schedules split each backward into an input-gradient and a deferred weight-gradient pass; with
# FSDP2 stages they train a different model here (first step: same loss, grad norm 1.2% off a single-process loop;
# after 10 steps 27-42%), so the trainer refuses them until that is understood
SPLIT_BACKWARD_SCHEDULES = ("interleaved_zero_bubble", "zbv_zero_bubble", "dual_pipe_v")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One parallel layout. Field names are the recipe's ``parallel.`` keys, so plan.json round-trips into a recipe."""

    backend: str
    zero_stage: int
    grad_reduce: str  # every_micro_step | once_per_step (see ParallelConfig.grad_reduce)
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    pp_schedule: str
    activation_checkpointing: str
    micro_batch_size: int
    offload_optimizer: bool
    offload_params: bool
    pp_virtual_stages: int = 1
    loss_parallel: bool = False  # vocabulary-parallel LM head and loss over the tp ranks
    sequence_parallel: bool = False  # norms and residual stream split over the sequence on the tp ranks

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many ranks see different samples."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def grad_accum_steps(self, global_batch_size: int) -> int:
        """Micro-steps per optimizer step: B / (micro_batch_size x dp), at least 1 (resolve_plan checks it is whole)."""
        return max(1, global_batch_size // (self.micro_batch_size * self.dp))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def unsupported(plan: Plan) -> str | None:
    """Why bigtrain's trainer cannot run ``plan`` yet, naming the recipe key; None when it can.

    The planner models more than the trainer runs (it ranks DeepSpeed, tp and pp plans for ``--all`` and for the
    other issues' engines); this is the single list of what is missing.
    """
    if plan.backend == "deepspeed" and plan.offload_params and plan.zero_stage != 3:
        return (
            f"parallel.offload_params=true with backend deepspeed needs zero_stage=3 (ZeRO-3 offload_param), not "
            f"{plan.zero_stage}; or offload only the optimizer (offload_optimizer=true)"
        )
    if plan.tp > 1 and plan.backend != "fsdp2":
        return f"parallel.tp={plan.tp} runs with backend fsdp2 (tensor parallel inside, FSDP2 over the data axes)"
    if plan.pp > 1 and plan.backend != "fsdp2":
        return f"parallel.pp={plan.pp} runs with backend fsdp2 (pipeline stages, FSDP2 over the data axes)"
    if plan.pp > 1 and plan.pp_schedule in SPLIT_BACKWARD_SCHEDULES:
        return (
            f"parallel.pp_schedule={plan.pp_schedule} (split input/weight backward) does not train the same model as a "
            "single-process loop with FSDP2 stages in torch 2.13; use gpipe, 1f1b, interleaved_1f1b or looped_bfs"
        )
    if plan.loss_parallel and plan.pp > 1:
        return "parallel.loss_parallel=true is not supported with parallel.pp > 1 yet; set one of them back"
    if plan.sequence_parallel and plan.pp > 1:
        return "parallel.sequence_parallel=true is not supported with parallel.pp > 1 yet; set one of them back"
    if plan.activation_checkpointing == "selective":
        return "parallel.activation_checkpointing=selective is not supported by the trainer yet; use none or full"
    if plan.offload_optimizer and plan.backend != "deepspeed":
        return (
            f"parallel.offload_optimizer=true needs backend deepspeed (ZeRO-Offload); backend {plan.backend} "
            "offloads parameters with their optimizer states: use offload_params=true"
            if plan.backend == "fsdp2"
            else f"parallel.offload_optimizer=true needs backend deepspeed (ZeRO-Offload), not {plan.backend}"
        )
    return None


def divisor_hint(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _multiples_hint(unit: int, near: int) -> str:
    lower = max(unit, (near // unit) * unit)
    return f"{lower} or {lower + unit}"


def _resolve_data_parallel(cfg: ParallelConfig, dp_total: int) -> tuple[int, int]:
    """(dp_replicate, dp_shard) for the backend: ddp replicates over all of dp, the sharded backends fill dp_shard."""
    replicate = None if cfg.dp_replicate in (None, -1) else cfg.dp_replicate
    shard = None if cfg.dp_shard in (None, -1) else cfg.dp_shard
    if cfg.backend == "ddp":
        if shard not in (None, 1):
            raise ConfigError(
                f"parallel.dp_shard={shard} shards parameters, which backend ddp does not do; "
                "unset it (ddp replicates over parallel.dp_replicate) or use backend fsdp2"
            )
        return (dp_total if replicate is None else replicate), 1
    if cfg.backend == "deepspeed" and replicate not in (None, 1):
        raise ConfigError(
            f"parallel.dp_replicate={replicate} (hybrid sharding) is an fsdp2 layout; deepspeed shards over the "
            "whole data-parallel world: unset it"
        )
    replicate = 1 if replicate is None else replicate
    if shard is None:
        if dp_total % replicate:
            raise ConfigError(
                f"parallel.dp_replicate={replicate} does not divide the data-parallel world {dp_total}; "
                f"use one of {divisor_hint(dp_total)}"
            )
        shard = dp_total // replicate
    return replicate, shard


def _resolve_zero_stage(cfg: ParallelConfig) -> int:
    stages = ZERO_STAGES[cfg.backend]
    if cfg.zero_stage is None:
        return stages[-1]
    if cfg.zero_stage not in stages:
        meaning = {
            "ddp": "ddp replicates everything: unset it or use 0",
            "fsdp2": "use 3 (reshard after forward) or 2 (keep parameters unsharded until backward ends)",
            "deepspeed": "use 1, 2 or 3",
        }[cfg.backend]
        raise ConfigError(f"parallel.zero_stage={cfg.zero_stage} is not a mode of backend {cfg.backend}; {meaning}")
    return cfg.zero_stage


def _resolve_grad_reduce(cfg: ParallelConfig) -> str:
    default = DEFAULT_GRAD_REDUCE[cfg.backend]
    if cfg.pp > 1:
        # torch's PipelineStage turns FSDP's gradient sync off for every micro-batch and reduces once after the last
        default = "once_per_step"
        if cfg.grad_reduce not in (None, default):
            raise ConfigError(
                f"parallel.grad_reduce={cfg.grad_reduce} is not possible with parallel.pp={cfg.pp}: pipeline stages "
                "reduce gradients once, after the step's last micro-batch; unset it"
            )
    if cfg.grad_reduce is None:
        return default
    if cfg.backend not in CHOOSES_GRAD_REDUCE and cfg.grad_reduce != default:
        raise ConfigError(
            f"parallel.grad_reduce={cfg.grad_reduce} is not a mode of backend {cfg.backend}, which reduces "
            f"{default}: unset it"
        )
    return cfg.grad_reduce


def resolve_plan(cfg: ParallelConfig, world_size: int, global_batch_size: int) -> Plan:
    """Turn the recipe's ``parallel`` section into a complete Plan for ``world_size`` ranks, or raise ConfigError."""
    if cfg.plan == "auto":
        raise ConfigError("parallel.plan=auto is chosen at start-up by the trainer (bigtrain/planner/auto.py)")
    for key in ("micro_batch_size", "tp", "pp", "pp_virtual_stages"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"parallel.{key}={getattr(cfg, key)} must be at least 1")
    for key in ("dp_replicate", "dp_shard"):
        value = getattr(cfg, key)
        if value is not None and value < 1 and value != -1:
            raise ConfigError(f"parallel.{key}={value} must be at least 1, or unset to fill the world")
    if cfg.offload_params and cfg.backend == "ddp":
        raise ConfigError("parallel.offload_params=true needs a sharded backend; use backend fsdp2")

    model_parallel = cfg.tp * cfg.pp
    if world_size % model_parallel:
        raise ConfigError(
            f"parallel.tp={cfg.tp} x parallel.pp={cfg.pp} = {model_parallel} does not divide the world size "
            f"{world_size}; use degrees whose product divides it ({divisor_hint(world_size)})"
        )
    replicate, shard = _resolve_data_parallel(cfg, world_size // model_parallel)
    product = replicate * shard * cfg.tp * cfg.pp
    if product != world_size:
        raise ConfigError(
            f"parallel degrees dp_replicate={replicate} x dp_shard={shard} x tp={cfg.tp} x pp={cfg.pp} = {product} "
            f"do not match the world size {world_size}; make them multiply to {world_size} "
            "(or leave parallel.dp_shard unset to fill it)"
        )
    plan = Plan(
        backend=cfg.backend,
        zero_stage=_resolve_zero_stage(cfg),
        grad_reduce=_resolve_grad_reduce(cfg),
        dp_replicate=replicate,
        dp_shard=shard,
        tp=cfg.tp,
        pp=cfg.pp,
        pp_schedule=cfg.pp_schedule,
        pp_virtual_stages=cfg.pp_virtual_stages,
        activation_checkpointing=cfg.activation_checkpointing,
        micro_batch_size=cfg.micro_batch_size,
        offload_optimizer=cfg.offload_optimizer,
        offload_params=cfg.offload_params,
        loss_parallel=cfg.loss_parallel,
        sequence_parallel=cfg.sequence_parallel,
    )
    if plan.loss_parallel and plan.tp == 1:
        raise ConfigError("parallel.loss_parallel=true shards the logits over the tp ranks; it needs parallel.tp > 1")
    if plan.sequence_parallel and plan.tp == 1:
        raise ConfigError(
            "parallel.sequence_parallel=true splits the sequence over the tp ranks; it needs parallel.tp > 1"
        )
    reason = unsupported(plan)
    if reason is not None:
        raise ConfigError(reason)
    unit = plan.micro_batch_size * plan.dp
    if global_batch_size < 1 or global_batch_size % unit:
        raise ConfigError(
            f"train.global_batch_size={global_batch_size} is not a multiple of parallel.micro_batch_size="
            f"{plan.micro_batch_size} x data-parallel degree {plan.dp} = {unit}; "
            f"try {_multiples_hint(unit, global_batch_size)}"
        )
    return plan
