"""How often the replica groups synchronise: every step (all-reduced gradients, today's data parallelism), or every
H steps by local SGD or (streaming) DiLoCo, for replicas joined by slow links (a site, or a node on plain Ethernet,
each).

The replicas are the ``dp_replicate`` groups. Inside a group FSDP2 shards (or DDP replicates) and reduces gradients
every step as always; across groups nothing is exchanged between synchronisations. Each group trains its own copy
on its own slice of every global batch with its own AdamW (the inner optimizer); every H steps the groups average
their pseudo-gradient (the last synchronised weights minus their own) and an outer step updates the synchronised
weights, which replace each group's copy. local SGD averages the weights (DiLoCo with outer lr 1, momentum 0);
DiLoCo takes a Nesterov step (arXiv 2311.08105: outer lr 0.7, momentum 0.9). Streaming DiLoCo (arXiv 2501.18512)
cuts the model into ``fragments`` synchronised at staggered steps, each transfer overlapping the next
``fragment_delay`` inner steps. ``engine/replica_sync.py`` runs it; ``schedule`` below is its calendar, which the
planner prices too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bigtrain.config.capabilities.table import Capability, Option, SearchSpace, row
from bigtrain.config.plan import Plan
from bigtrain.config.setup import Setup

SYNC_MODES = ("every_step", "local_sgd", "diloco")
SYNC_DTYPES = ("fp32", "bf16")
OUTER_STATE_PLACES = ("host", "device")

SYNC = Option(
    "sync",
    "every_step",
    "How the dp_replicate groups synchronise: every_step (gradients all-reduced each step), local_sgd (weights "
    "averaged every sync_every steps) or diloco (an outer Nesterov step on the averaged pseudo-gradient every "
    "sync_every steps; streaming with fragments > 1). docs/slow-links.md says when each pays.",
)  # no example: the capability matrix's row sets it with the replica groups it needs (docs/generate.py)
SYNC_EVERY = Option("sync_every", 100, "Inner steps between two synchronisations of the same weights (H).")
OUTER_LR = Option("outer_lr", 0.7, "DiLoCo's outer learning rate (the paper's 0.7); local_sgd uses 1.")
OUTER_MOMENTUM = Option("outer_momentum", 0.9, "DiLoCo's outer Nesterov momentum (the paper's 0.9); local_sgd uses 0.")
FRAGMENTS = Option(
    "fragments", 1, "Streaming DiLoCo: the model cut into this many fragments, synchronised at staggered steps."
)
FRAGMENT_DELAY = Option(
    "fragment_delay",
    0,
    "Streaming: inner steps a fragment's all-reduce overlaps before its outer step is applied (tau); the fragment's "
    "local progress during them is replaced by the synchronised weights.",
)
SYNC_DTYPE = Option(
    "sync_dtype", "fp32", "The dtype of the pseudo-gradients' all-reduce across replicas: fp32 or bf16."
)
OUTER_STATE = Option(
    "outer_state",
    "host",
    "Where the fp32 outer state (the last synchronised weights and the outer momentum, 8 bytes per trained "
    "parameter, sharded like it) lives: host or device.",
)
REPLICA_FAILURES = Option(
    "replica_failures",
    "stop",
    "What a dead replica group does to the others: stop (the job stops; start again to resume from the last "
    "checkpoint) or continue (each group a job of its own, joined by torchft: the others train on, and the dead "
    "group, started again, takes a healthy group's state and rejoins).",
)
OPTIONS = (
    SYNC,
    SYNC_EVERY,
    OUTER_LR,
    OUTER_MOMENTUM,
    FRAGMENTS,
    FRAGMENT_DELAY,
    SYNC_DTYPE,
    OUTER_STATE,
    REPLICA_FAILURES,
)


@dataclass(frozen=True)
class SyncSettings:
    """A plan's synchronisation, with local SGD's fixed outer step spelled out."""

    mode: str
    every: int  # H
    outer_lr: float
    outer_momentum: float
    fragments: int
    delay: int  # tau
    dtype: str
    outer_state: str

    @property
    def semi_synchronous(self) -> bool:
        return self.mode != "every_step"

    def sends(self, step: int) -> list[int]:
        """The fragments whose pseudo-gradient is sent after inner step ``step`` (1-based)."""
        return [f for f in range(self.fragments) if step % self.every == (self._due(f) - self.delay) % self.every]

    def applies(self, step: int) -> list[int]:
        """The fragments whose outer step is applied after inner step ``step`` (``delay`` steps after their send)."""
        return [f for f in range(self.fragments) if step % self.every == self._due(f) % self.every]

    def _due(self, fragment: int) -> int:
        """Fragment f is synchronised at steps (f + 1) H / F modulo H: the last one at multiples of H."""
        return (fragment + 1) * self.every // self.fragments


def settings_of(plan: Plan) -> SyncSettings:
    mode = SYNC.of(plan)
    local_sgd = mode == "local_sgd"
    return SyncSettings(
        mode=mode,
        every=SYNC_EVERY.of(plan),
        outer_lr=1.0 if local_sgd else OUTER_LR.of(plan),
        outer_momentum=0.0 if local_sgd else OUTER_MOMENTUM.of(plan),
        fragments=FRAGMENTS.of(plan),
        delay=FRAGMENT_DELAY.of(plan),
        dtype=SYNC_DTYPE.of(plan),
        outer_state=OUTER_STATE.of(plan),
    )


def _sync_values_allowed(s: Setup) -> str | None:
    for option, allowed in ((SYNC, SYNC_MODES), (SYNC_DTYPE, SYNC_DTYPES), (OUTER_STATE, OUTER_STATE_PLACES)):
        value = option.of(s.plan)
        if value not in allowed:
            return f"{option.key}={value} is not allowed; use one of: {', '.join(allowed)}"
    if REPLICA_FAILURES.of(s.plan) not in ("stop", "continue"):
        return f"{REPLICA_FAILURES.key}={REPLICA_FAILURES.of(s.plan)} is not allowed; use one of: stop, continue"
    return None


def _semi_synchronous(s: Setup) -> str | None:
    """The mode's name when the plan synchronises every H steps, else None."""
    mode = SYNC.of(s.plan)
    return mode if mode in SYNC_MODES[1:] else None


def _needs_replica_groups(s: Setup) -> str | None:
    mode = _semi_synchronous(s)
    if mode and s.plan.dp_replicate < 2:
        return (
            f"parallel.sync={mode} synchronises replica groups, and parallel.dp_replicate={s.plan.dp_replicate} "
            "makes one: set parallel.dp_replicate to the number of groups (a node or a site each, >= 2), with "
            "dp_shard the ranks of each"
        )
    return None


def _period_and_fragments(s: Setup) -> str | None:
    mode = _semi_synchronous(s)
    if not mode:
        return None
    every, fragments, delay = SYNC_EVERY.of(s.plan), FRAGMENTS.of(s.plan), FRAGMENT_DELAY.of(s.plan)
    if every < 1 or fragments < 1:
        return f"parallel.sync_every={every} and parallel.fragments={fragments} must be >= 1"
    if every % fragments:
        divisible = [h for h in range(every - every % fragments, every + fragments + 1, fragments) if h > 0][:2]
        return (
            f"parallel.sync_every={every} is not divisible by parallel.fragments={fragments} (each fragment is "
            f"synchronised every {every} steps, {every}/{fragments} steps after the previous one); try sync_every "
            f"{' or '.join(map(str, divisible))}"
        )
    if not 0 <= delay < every // fragments:
        return (
            f"parallel.fragment_delay={delay} must be >= 0 and below sync_every / fragments = {every // fragments} "
            "(a fragment's transfer ends before the next fragment's begins)"
        )
    return None


def _outer_step(s: Setup) -> str | None:
    if _semi_synchronous(s) != "diloco":
        return None
    lr, momentum = OUTER_LR.of(s.plan), OUTER_MOMENTUM.of(s.plan)
    if lr <= 0:
        return f"parallel.outer_lr={lr:g} must be > 0 (DiLoCo's paper uses 0.7; 1 with momentum 0 is local SGD)"
    if not 0 <= momentum < 1:
        return f"parallel.outer_momentum={momentum:g} must be in [0, 1) (DiLoCo's paper uses 0.9)"
    return None


def _semi_synchronous_engines(s: Setup) -> str | None:
    mode = _semi_synchronous(s)
    if not mode:
        return None
    p = s.plan
    for key, value, on, instead in (
        ("parallel.backend", p.backend, p.backend == "deepspeed", "fsdp2 (or ddp)"),
        ("parallel.pp", p.pp, p.pp > 1, "1"),
        ("parallel.ep", p.ep, p.ep > 1, "1"),
        ("train.mixed_precision", s.train.mixed_precision, s.train.mixed_precision == "fp16", "bf16"),
    ):
        if on:
            return (
                f"parallel.sync={mode} with {key}={value} is not built yet (each replica group's step runs on the "
                f"torch-native engine, one loss scale for all); use {key}={instead}, or parallel.sync=every_step"
            )
    return None


def _replica_failures(s: Setup) -> str | None:
    if REPLICA_FAILURES.of(s.plan) != "continue" or _semi_synchronous(s):
        return None
    return (
        "parallel.replica_failures=continue lets the other replica groups train on between synchronisations, and "
        f"parallel.sync={SYNC.of(s.plan)} synchronises every step: set parallel.sync to local_sgd or diloco, or "
        "replica_failures=stop"
    )


# what the search weighs where the user described a slow link between groups of GPUs: DiLoCo every H steps (the
# paper's range: H = 500 matched synchronous training with 8 replicas; smaller H stays closer to it), whole or
# streamed in 4 fragments whose transfers each overlap a few inner steps
SEARCHED_PERIODS = (20, 100, 500)
SEARCHED_FRAGMENTS = 4
SEARCHED_DELAY = 5


def _sync_variants(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    """Without a described slow link, nothing (``plan: auto`` never turns it on blind). With one: for each plan whose
    replica groups are the link's groups, DiLoCo at each searched period, whole and streamed. Pinned settings
    (``--fix sync=diloco``) are the plans' own, link or not."""
    pinned = {option.name: space.fixed[option.name] for option in OPTIONS if space.pinned(option.name)}
    if pinned:
        return [_with_options(plan, pinned) for plan in plans]
    if not space.link_groups:
        return plans
    out = []
    for plan in plans:
        out.append(plan)
        if plan.dp_replicate != space.link_groups or plan.backend == "deepspeed" or plan.pp > 1 or plan.ep > 1:
            continue
        for every in SEARCHED_PERIODS:
            out.append(plan.with_option(SYNC.name, "diloco").with_option(SYNC_EVERY.name, every))
            delay = min(SEARCHED_DELAY, every // SEARCHED_FRAGMENTS - 1)
            streamed = out[-1].with_option(FRAGMENTS.name, SEARCHED_FRAGMENTS)
            out.append(streamed.with_option(FRAGMENT_DELAY.name, delay))
    return out


def _with_options(plan: Plan, values: dict[str, Any]) -> Plan:
    for name, value in values.items():
        plan = plan.with_option(name, value)
    return plan


def _outer_state_bytes(stats: Any, plan: Plan, workload: Any) -> int:
    """Device bytes a semi-synchronous plan adds per rank: the fp32 outer state where it lives on the device (8 bytes
    per trained parameter of the rank's shard), and one fragment's pseudo-gradient while it is sent (fp32, and its
    copy in the sync dtype). Adapter plans train few parameters: counted as none."""
    sync = settings_of(plan)
    if not sync.semi_synchronous or workload.adapters:
        return 0
    shards = {"fsdp2": plan.dp_shard * plan.cp}.get(plan.backend, 1)
    local = stats.params / (shards * plan.tp * plan.pp)
    in_flight = (4 + (2 if sync.dtype == "bf16" else 4)) * local / sync.fragments
    return int((8 * local if sync.outer_state == "device" else 0) + in_flight)


def _export_note(target: str, plan: Plan) -> str | None:
    sync = settings_of(plan)
    if not sync.semi_synchronous:
        return None
    return (
        f"parallel.sync={sync.mode} (every {sync.every} steps across the {plan.dp_replicate} replica groups) has no "
        f"{target} setting: the exported config synchronises every step; run the plan with bigtrain train"
    )


CAPABILITY = Capability(
    engine="bigtrain.engine.replica_sync",  # its plans run inside ReplicaSyncEngine (wrap)
    name="replica_sync",
    summary="replica groups synchronised every step, or every H steps by local SGD or (streaming) DiLoCo for slow "
    "links between them",
    rules=(
        row(_sync_values_allowed, "invalid"),
        row(_needs_replica_groups, "invalid"),
        row(_period_and_fragments, "invalid"),
        row(_outer_step, "invalid"),
        row(_semi_synchronous_engines, "not_built"),
        row(_replica_failures, "invalid"),
    ),
    options=OPTIONS,
    variants=_sync_variants,
    memory=_outer_state_bytes,
    export_note=_export_note,
)
