"""How the search orders what it found: by predicted step time, the simplest plan first among near ties (within
NEAR_TIE of the fastest: fewer dimensions and engines to go wrong), then what does not fit."""

from __future__ import annotations

from typing import Any

from bigtrain.config.capabilities.reference import REFERENCE
from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.plan import Plan
from bigtrain.planner.replica_sync_time import WAIT_SHARE

Candidate = Any  # planner.search.Candidate (which imports this module): a plan with its predictions and verdict

NEAR_TIE = 0.02
SAME_TIME = 0.001  # steps predicted this close (a share of the fastest) take the same time


def complexity(plan: Plan) -> int:
    """How many moving parts a plan has; breaks near ties in favour of the simpler plan."""
    score = {"ddp": 0, "fsdp2": 1, "deepspeed": 2}[plan.backend] + (plan.zero_stage == 3)
    score += 2 * (plan.tp > 1) + 2 * (plan.pp > 1) + 2 * (plan.cp > 1) + 2 * (plan.ep > 1)
    score += plan.dp_replicate > 1 and plan.backend == "fsdp2"
    score += {"none": 0, "selective": 1, "full": 2}[plan.activation_checkpointing] + (plan.loss_chunk_tokens > 0)
    # semi-synchronous training: two parts (the outer step, and a final model no every-step run gives); streaming
    # adds none that a user tunes (a near tie goes to the shortest period instead, ``_rank``)
    score += 2 * settings_of(plan).semi_synchronous
    # a precomputed reference: a pass before the first step and a file beside the run; an offloaded one: PCIe copies
    score += {"precomputed": 1, "offloaded": 3}.get(REFERENCE.of(plan), 0)
    return score + 3 * (plan.offload_params or plan.offload_optimizer) + 2 * plan.offload_activations


def _rejection_order(c: Candidate) -> tuple[int, int]:
    if c.structural is not None:
        return 2, 0
    return ("budget" not in (c.rejected_because or "")), c.memory.budget_bytes


def _synchronous_unless_waiting(fitting: list[Candidate]) -> list[Candidate]:
    """The plans the choice is made among: the every-step ones, unless the fastest of them waits on the slow link
    between replica groups for more than WAIT_SHARE of its step (``replica_sync_time``)."""
    synchronous = [c for c in fitting if not settings_of(c.plan).semi_synchronous]
    if not synchronous or len(synchronous) == len(fitting):
        return fitting
    best = synchronous[0]
    return fitting if best.time.link_wait_s > WAIT_SHARE * best.time.step_s else synchronous


def rank(candidates: list[Candidate]) -> list[Candidate]:
    """Fitting plans by predicted time (the simplest first among near ties), then the rest. Plans that offload
    activations come after every fitting plan that does not: their PCIe copies are timed by assumption (overlap with
    compute at the datasheet's PCIe rate), not yet measured on a GPU, so they are chosen where they make a job fit."""
    fitting = sorted((c for c in candidates if c.fits), key=lambda c: (c.plan.offload_activations, c.time.step_s))
    pool = _synchronous_unless_waiting(fitting)
    if pool:
        limit = pool[0].time.step_s * (1 + NEAR_TIE)
        near = [
            c for c in pool if c.time.step_s <= limit and c.plan.offload_activations == pool[0].plan.offload_activations
        ]
        # compile and FP8 count as moving parts too: chosen where they are faster, not on a near tie; among
        # semi-synchronous plans of a tie, the shortest period (the closest to synchronous training); steps the
        # model predicts as long to within SAME_TIME (a classifier's micro-batches, whose time model has no
        # per-kernel efficiency term) go to the larger micro-batch: fewer, larger kernels
        fastest = pool[0].time.step_s
        best = min(
            near,
            key=lambda c: (
                complexity(c.plan) + c.compile + 2 * (c.fp8 != "none"),
                settings_of(c.plan).every if settings_of(c.plan).semi_synchronous else 0,
                round(c.time.step_s / fastest / SAME_TIME),
                -c.plan.micro_batch_size,
                c.time.step_s,
            ),
        )
        fitting.remove(best)
        fitting.insert(0, best)
    # rejected: those that only lack GPU memory first, smallest need first; then those short of host memory, the
    # same way; then those that cannot work here whatever the memory, in the order searched (not predicted for it)
    rejected = sorted((c for c in candidates if not c.fits), key=_rejection_order)
    return fitting + rejected
