"""Enumerate every plan that meets the global batch, predict memory and time for each, keep what fits, rank.

Search space: backend (ddp, fsdp2 ZeRO-2/3, deepspeed ZeRO-1/2/3) x dp_replicate/dp_shard (HSDP) x tp (dividing the
attention and KV heads, within a node) x pp (dividing the layers; 1F1B or GPipe) x activation checkpointing x
micro-batch (powers of two) x offload. Ranked by predicted step time; among plans within NEAR_TIE of the fastest the
simplest wins (fewer dimensions and engines to go wrong). ``trainer_only`` limits the space to what bigtrain's
trainer can run today, for ``parallel.plan: auto``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from bigtrain.errors import ConfigError
from bigtrain.plan.cost import TimeEstimate, estimate_time
from bigtrain.plan.hardware import Cluster, GiB
from bigtrain.plan.memory import MemoryEstimate, estimate_memory
from bigtrain.plan.model_stats import ModelStats
from bigtrain.plan.plan import Plan

NEAR_TIE = 0.02
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
PLAN_FIELDS = tuple(f.name for f in fields(Plan))
CHOICES: dict[str, tuple[Any, ...]] = {
    "backend": ("ddp", "fsdp2", "deepspeed"),
    "activation_checkpointing": ("none", "selective", "full"),
    "pp_schedule": ("1f1b", "gpipe"),
    "offload_optimizer": (False, True),
    "offload_params": (False, True),
}


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    memory: MemoryEstimate
    time: TimeEstimate
    fits: bool
    rejected_because: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "memory": self.memory.to_dict(),
            "time": self.time.to_dict(),
            "fits": self.fits,
            "rejected_because": self.rejected_because,
        }


def complexity(plan: Plan) -> int:
    """How many moving parts a plan has; breaks near ties in favour of the simpler plan."""
    score = {"ddp": 0, "fsdp2": 1, "deepspeed": 2}[plan.backend] + (plan.zero_stage == 3)
    score += 2 * (plan.tp > 1) + 2 * (plan.pp > 1) + (plan.dp_replicate > 1 and plan.backend == "fsdp2")
    score += {"none": 0, "selective": 1, "full": 2}[plan.activation_checkpointing]
    return score + 3 * (plan.offload_params or plan.offload_optimizer)


def parse_fix(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``--fix key=value`` pins -> typed values, with a clear error for unknown fields and impossible values."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or key not in PLAN_FIELDS:
            raise ConfigError(f"--fix {item!r}: unknown plan field; use one of {', '.join(PLAN_FIELDS)}")
        text = text.strip()
        if key in CHOICES:
            lookup = {str(c).lower(): c for c in CHOICES[key]}
            if text.lower() not in lookup:
                raise ConfigError(f"--fix {key}={text}: use one of {', '.join(str(c).lower() for c in CHOICES[key])}")
            out[key] = lookup[text.lower()]
            continue
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"--fix {key}={text}: {key} takes a whole number") from None
        if value < (0 if key == "zero_stage" else 1) or (key == "zero_stage" and value > 3):
            raise ConfigError(
                f"--fix {key}={value} is impossible; "
                + (
                    "zero_stage is 0 (ddp), 1-3 (deepspeed) or 2-3 (fsdp2)"
                    if key == "zero_stage"
                    else "it must be >= 1"
                )
            )
        out[key] = value
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _structural_problem(stats: ModelStats, plan: Plan, cluster: Cluster) -> str | None:
    if plan.tp > cluster.gpus_per_node:
        return f"tp={plan.tp} crosses node boundary ({cluster.gpus_per_node} GPUs per node)"
    if stats.heads % plan.tp or stats.kv_heads % plan.tp:
        return (
            f"tp={plan.tp} does not divide num_attention_heads={stats.heads} and num_key_value_heads={stats.kv_heads}"
        )
    if plan.pp > stats.layers:
        return f"pp={plan.pp} exceeds the {stats.layers} layers"
    return None


def _layouts(stats: ModelStats, cluster: Cluster, backend: str, trainer_only: bool):
    """(dp_replicate, dp_shard, tp, pp) splits of the world for one backend."""
    world = cluster.num_gpus
    for tp in [d for d in _divisors(world) if d <= 2 * cluster.gpus_per_node]:
        for pp in _divisors(world // tp):
            if pp > stats.layers or (trainer_only and (tp > 1 or pp > 1)):
                continue
            dp = world // (tp * pp)
            if backend == "fsdp2":  # HSDP: any split of dp into replicas of shards
                yield from ((r, dp // r, tp, pp) for r in _divisors(dp))
            elif backend == "ddp":
                yield dp, 1, tp, pp
            else:
                yield 1, dp, tp, pp


def _offloads(backend: str, trainer_only: bool) -> list[tuple[bool, bool]]:
    """(offload_optimizer, offload_params) choices: FSDP2 offloads parameters, DeepSpeed the optimizer."""
    if trainer_only or backend == "ddp":
        return [(False, False)]
    return [(False, False), (True, False) if backend == "deepspeed" else (False, True)]


def enumerate_plans(
    stats: ModelStats, cluster: Cluster, global_batch_size: int, fixed: dict[str, Any], trainer_only: bool
) -> Iterator[Plan]:
    """Every plan that meets the global batch and the pins in ``fixed``."""
    stages = {"ddp": (0,), "fsdp2": (3, 2), "deepspeed": (1, 2, 3)}
    checkpointing = ("none", "full") if trainer_only else CHOICES["activation_checkpointing"]
    for backend in ("ddp", "fsdp2") if trainer_only else CHOICES["backend"]:
        for replicate, shard, tp, pp in _layouts(stats, cluster, backend, trainer_only):
            micro = [mb for mb in MICRO_BATCHES if global_batch_size % (mb * replicate * shard) == 0]
            schedules = ("1f1b", "gpipe") if pp > 1 else ("1f1b",)
            for mb, ac, stage, schedule, (off_opt, off_par) in itertools.product(
                micro, checkpointing, stages[backend], schedules, _offloads(backend, trainer_only)
            ):
                plan = Plan(backend, stage, replicate, shard, tp, pp, schedule, ac, mb, off_opt, off_par)
                if all(getattr(plan, k) == v for k, v in fixed.items()):
                    yield plan


def search(
    stats: ModelStats,
    cluster: Cluster,
    seq_len: int,
    global_batch_size: int,
    mixed_precision: str,
    fixed: dict[str, Any] | None = None,
    trainer_only: bool = False,
) -> list[Candidate]:
    """All candidates, best first: fitting ones by predicted step time (simplest on near ties), then the rest."""
    fixed = fixed or {}
    budget = cluster.gpu.memory_bytes
    out = []
    for plan in enumerate_plans(stats, cluster, global_batch_size, fixed, trainer_only):
        mem = estimate_memory(stats, plan, seq_len, mixed_precision, global_batch_size)
        time = estimate_time(stats, plan, cluster, seq_len, global_batch_size, mixed_precision)
        reason = _structural_problem(stats, plan, cluster)
        if reason is None and mem.budget_bytes > budget:
            reason = f"needs {mem.budget_bytes / GiB:.1f} GiB > {budget / GiB:.1f} GiB budget"
        out.append(Candidate(plan, mem, time, reason is None, reason))
    if not out:
        pins = ", ".join(f"{k}={v}" for k, v in fixed.items()) or "none"
        raise ConfigError(
            f"no plan meets global batch {global_batch_size} on {cluster.num_gpus} GPUs with pins ({pins}); "
            "use a global batch that is a multiple of the GPU count, or fewer pins"
        )
    fitting = sorted((c for c in out if c.fits), key=lambda c: c.time.step_s)
    if fitting:
        limit = fitting[0].time.step_s * (1 + NEAR_TIE)
        best = min((c for c in fitting if c.time.step_s <= limit), key=lambda c: (complexity(c.plan), c.time.step_s))
        fitting.remove(best)
        fitting.insert(0, best)
    # rejected: structurally valid ones that only lack memory first, smallest need first
    rejected = sorted(
        (c for c in out if not c.fits),
        key=lambda c: ("budget" not in (c.rejected_because or ""), c.memory.budget_bytes),
    )
    return fitting + rejected
