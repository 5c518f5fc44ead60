"""The ``Plan``: a frozen description of how one job is parallelised, and its resolution from a recipe.

Pure Python on purpose (no ``torch.distributed``): the planner and the tests reason about plans without processes.
``resolve_plan`` fills derived degrees, checks that they multiply to the world size and that the global batch splits
into whole micro-batches, and rejects what the trainer cannot run yet, each with one line naming the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from bigtrain.config.schema import ParallelConfig
from bigtrain.errors import ConfigError

# What the trainer can execute today; the planner may model more (see bigtrain plan).
TRAINER_BACKENDS = ("ddp", "fsdp2")


@dataclass(frozen=True)
class Plan:
    """One parallel layout. Field names are the recipe's ``parallel.`` keys, so plan.json round-trips into a recipe."""

    backend: str
    zero_stage: int
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    pp_schedule: str
    activation_checkpointing: str
    micro_batch_size: int
    offload_optimizer: bool
    offload_params: bool

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many ranks see different samples."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def grad_accum_steps(self, global_batch_size: int) -> int:
        """Micro-steps per optimizer step: B / (micro_batch_size x dp), which resolve_plan checked is whole."""
        return global_batch_size // (self.micro_batch_size * self.dp)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _divisor_hint(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _multiples_hint(unit: int, near: int) -> str:
    lower = max(unit, (near // unit) * unit)
    return f"{lower} or {lower + unit}"


def resolve_plan(cfg: ParallelConfig, world_size: int, global_batch_size: int) -> Plan:
    """Turn the recipe's ``parallel`` section into a complete Plan for ``world_size`` ranks, or raise ConfigError."""
    if cfg.plan == "auto":
        raise ConfigError("parallel.plan=auto is chosen at start-up by the trainer (bigtrain/plan/auto.py)")
    if cfg.backend not in TRAINER_BACKENDS:
        raise ConfigError(f"parallel.backend={cfg.backend} is not supported by the trainer yet; use ddp or fsdp2")
    for key in ("tp", "pp"):
        value = getattr(cfg, key)
        if value != 1:
            raise ConfigError(f"parallel.{key}={value} is not supported by the trainer yet; use parallel.{key}=1")
    if cfg.activation_checkpointing == "selective":
        raise ConfigError("parallel.activation_checkpointing=selective is not supported yet; use none or full")
    if cfg.offload_optimizer:
        raise ConfigError(
            "parallel.offload_optimizer=true needs the deepspeed backend, not supported yet; set it to false"
        )
    for key in ("micro_batch_size", "tp", "pp"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"parallel.{key}={getattr(cfg, key)} must be at least 1")
    for key in ("dp_replicate", "dp_shard"):
        value = getattr(cfg, key)
        if value is not None and value < 1 and value != -1:
            raise ConfigError(f"parallel.{key}={value} must be at least 1, or unset to fill the world")

    model_parallel = cfg.tp * cfg.pp
    if world_size % model_parallel:
        raise ConfigError(
            f"parallel.tp={cfg.tp} x parallel.pp={cfg.pp} = {model_parallel} does not divide the world size "
            f"{world_size}; use degrees whose product divides it ({_divisor_hint(world_size)})"
        )
    dp_total = world_size // model_parallel
    replicate = None if cfg.dp_replicate in (None, -1) else cfg.dp_replicate
    shard = None if cfg.dp_shard in (None, -1) else cfg.dp_shard

    if cfg.backend == "ddp":
        if shard not in (None, 1):
            raise ConfigError(
                f"parallel.dp_shard={shard} shards parameters, which backend ddp does not do; "
                "unset it (ddp replicates over parallel.dp_replicate) or use backend fsdp2"
            )
        if cfg.zero_stage not in (None, 0):
            raise ConfigError(f"parallel.zero_stage={cfg.zero_stage} does not apply to backend ddp; unset it or use 0")
        if cfg.offload_params:
            raise ConfigError("parallel.offload_params=true needs a sharded backend; use backend fsdp2")
        shard = 1
        replicate = dp_total if replicate is None else replicate
        zero_stage = 0
    else:
        zero_stage = 3 if cfg.zero_stage is None else cfg.zero_stage
        if zero_stage not in (2, 3):
            raise ConfigError(
                f"parallel.zero_stage={zero_stage} is not an fsdp2 mode; use 3 (reshard after forward) "
                "or 2 (keep parameters unsharded until backward ends)"
            )
        replicate = 1 if replicate is None else replicate
        if shard is None:
            if dp_total % replicate:
                raise ConfigError(
                    f"parallel.dp_replicate={replicate} does not divide the data-parallel world {dp_total}; "
                    f"use one of {_divisor_hint(dp_total)}"
                )
            shard = dp_total // replicate

    product = replicate * shard * cfg.tp * cfg.pp
    if product != world_size:
        raise ConfigError(
            f"parallel degrees dp_replicate={replicate} x dp_shard={shard} x tp={cfg.tp} x pp={cfg.pp} = {product} "
            f"do not match the world size {world_size}; make them multiply to {world_size} "
            "(or leave parallel.dp_shard unset to fill it)"
        )

    plan = Plan(
        backend=cfg.backend,
        zero_stage=zero_stage,
        dp_replicate=replicate,
        dp_shard=shard,
        tp=cfg.tp,
        pp=cfg.pp,
        pp_schedule=cfg.pp_schedule,
        activation_checkpointing=cfg.activation_checkpointing,
        micro_batch_size=cfg.micro_batch_size,
        offload_optimizer=cfg.offload_optimizer,
        offload_params=cfg.offload_params,
    )
    unit = plan.micro_batch_size * plan.dp
    if global_batch_size < 1 or global_batch_size % unit:
        raise ConfigError(
            f"train.global_batch_size={global_batch_size} is not a multiple of parallel.micro_batch_size="
            f"{plan.micro_batch_size} x data-parallel degree {plan.dp} = {unit}; "
            f"try {_multiples_hint(unit, global_batch_size)}"
        )
    return plan
