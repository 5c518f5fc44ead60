"""The ``Plan``: a frozen description of how one job is parallelised, and the modes each backend has.

Pure Python on purpose (no ``torch``): the planner, the trainer and the tests reason about plans without processes.
``resolve.py`` makes a Plan of a recipe's ``parallel`` section; ``capabilities/`` says which plans run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ZERO_STAGES = {"ddp": (0,), "fsdp2": (2, 3), "deepspeed": (1, 2, 3)}
# How each backend reduces gradients during accumulation when the recipe leaves grad_reduce unset; only fsdp2 may
# choose the other mode. DDP reduces in its backward hooks, and reducing inner micro-steps would cost accum x the
# traffic for nothing (its gradients are unsharded either way); DeepSpeed ZeRO-2/3 reduces every micro-step and
# refuses no_sync.
DEFAULT_GRAD_REDUCE = {"ddp": "once_per_step", "fsdp2": "every_micro_step", "deepspeed": "every_micro_step"}
CHOOSES_GRAD_REDUCE = ("fsdp2",)
# torch's zero-bubble schedules, which split each backward into an input- and a deferred weight-gradient pass
# (capabilities/pipeline.py says why they are refused)
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
    loss_chunk_tokens: int = 0  # LM head and cross-entropy over chunks of this many tokens (0: all at once)
    cp: int = 1  # context parallelism: each row's sequence split over cp ranks (all-to-all around attention)
    checkpoint_every: int = 1  # activation checkpointing applies to every k-th decoder block (1: all of them)
    offload_activations: bool = False  # what each decoder block saves for backward waits in host memory
    ep: int = 1  # expert parallelism: a mixture's experts split over ep of the dp_shard ranks (all-to-all dispatch)
    # the parallel keys capability records bring, as sorted (name, value) pairs (read by ``table.Option.of``)
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many ranks see different samples."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def grad_accum_steps(self, global_batch_size: int) -> int:
        """Micro-steps per optimizer step: B / (micro_batch_size x dp), at least 1 (resolve_plan checks it is whole)."""
        return max(1, global_batch_size // (self.micro_batch_size * self.dp))

    def but(self, **changes: Any) -> Plan:
        """A copy with ``changes`` (field names only): ``dataclasses.replace`` without its per-call introspection,
        which the planner's search paid for on every one of its hundreds of thousands of variants. Plan has no
        ``__post_init__`` to skip."""
        if not changes.keys() <= PLAN_FIELD_NAMES:
            raise TypeError(f"Plan has no field(s) {sorted(changes.keys() - PLAN_FIELD_NAMES)}")
        plan = object.__new__(Plan)
        plan.__dict__.update(self.__dict__)
        plan.__dict__.update(changes)
        return plan

    def with_option(self, name: str, value: Any) -> Plan:
        return self.but(options=tuple(sorted({**dict(self.options), name: value}.items())))

    def to_dict(self) -> dict[str, Any]:
        """The plan under its recipe keys (the records' options flat among the others, as a recipe writes them)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "options"}
        return {**fields, **dict(self.options)}

    @staticmethod
    def from_dict(values: dict[str, Any]) -> Plan:
        """The inverse of ``to_dict``: a plan.json's keys, the records' options among them, back into a Plan."""
        own = {k: v for k, v in values.items() if k in PLAN_FIELD_NAMES and k != "options"}
        options = tuple(sorted((k, v) for k, v in values.items() if k not in PLAN_FIELD_NAMES))
        return Plan(**own, options=options)


PLAN_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Plan))


def divisor_hint(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def multiples_hint(unit: int, near: int) -> str:
    lower = max(unit, (near // unit) * unit)
    return f"{lower} or {lower + unit}"
