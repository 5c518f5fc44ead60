"""A worker of an elastic run (``bigtrain train --elastic``, under bigtrain's ``--nproc`` launcher or torchrun's
``--nnodes MIN:MAX``): what changes when the job starts again on another number of ranks.

- The recipe's written plan is kept where it runs on the ranks there are; where it does not (a dimension no longer
  divides the world or the global batch), the planner plans for this world, as ``plan: auto`` does, keeping the
  recipe's method, objective and global batch (``written_or_replanned``). The resume then reads the newest good
  checkpoint onto the new plan (checkpoints resume across plans and world sizes), and the global order continues at
  the checkpoint's step: no row is repeated or skipped.
- Rank 0 says the change in one line (``replan_line``): the plan before and after, their predicted peaks (and step
  times on GPUs), the steps lost since the checkpoint and how long the restart took.
- A rank whose device is unusable leaves with ``EXIT_DEVICE_GONE`` (``leave``), which the launcher reads as a loss
  for good: it restarts on the devices that remain instead of trying the same one again. ``--lose-rank R@STEP``
  makes rank R leave that way before step STEP, a drill of what a lost GPU costs.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigtrain.checkpoint.layout import last_good_checkpoint, newest_of_run
from bigtrain.config.plan import Plan
from bigtrain.errors import ConfigError
from bigtrain.train.replica_groups import GROUPS_FOLDER, survives_failures

log = logging.getLogger("bigtrain")

EXIT_DEVICE_GONE = 8  # this rank's device is gone (or a drill says so): the launcher restarts without it
# an elastic worker stopped by a signal before the last step, after its checkpoint: not the run's end (a preempted
# node's peers stop with it, and their agent must start them again on the nodes that remain); a whole job that is
# stopped ends anyway, since its agents got the signal themselves
EXIT_STOPPED_EARLY = 9
TRIES = 16  # rank counts planned each way when no plan runs on the ranks that remain


@dataclass(frozen=True)
class Elastic:
    """What a worker of an elastic run is told by its launcher."""

    lose: tuple[int, int] | None = None  # --lose-rank: (rank, step) at which that rank leaves for good
    lost_at: float | None = None  # when the launcher saw the last loss (seconds since the epoch): the restart's time

    def may_replan(self, cfg: Any) -> bool:
        """A first start runs the recipe's plan as written (a plan that does not run is the user's to fix); a restart
        (after a loss, or with a checkpoint to resume) may re-plan."""
        if self.lost_at is not None:
            return True
        return cfg.checkpoint.resume is not False and newest_of_run(cfg.output_dir) is not None

    def before_step(self, rank: int, step: int) -> None:
        """Leave for good before ``step`` (1-based, the step about to run) if the drill says so for this rank."""
        if self.lose is not None and self.lose == (rank, step):
            leave(f"rank {rank} leaves before step {step} (--lose-rank {rank}@{step}: its device is taken as gone)")


def parse_lose_rank(text: str) -> tuple[int, int]:
    """``R@STEP`` as (rank, step)."""
    rank, at, step = text.partition("@")
    try:
        parsed = (int(rank), int(step))
    except ValueError:
        parsed = (-1, 0)
    if not at or parsed[0] < 0 or parsed[1] < 1:
        raise ConfigError(f"--lose-rank={text!r} is not RANK@STEP (e.g. 3@20: rank 3 leaves before step 20)")
    return parsed


def leave(line: str) -> None:
    """This rank stops at once with ``EXIT_DEVICE_GONE`` (nothing flushed to the device, as a lost GPU would)."""
    sys.stderr.flush()
    os.write(2, f"\nbigtrain: {line}\n".encode())
    os._exit(EXIT_DEVICE_GONE)


def check_device(device: Any) -> None:
    """A rank that cannot use its GPU says so and leaves for good, rather than failing each restart the same way."""
    if device.type != "cuda":
        return
    import torch

    try:
        torch.ones(1, device=device).sum().item()
    except torch.cuda.OutOfMemoryError:
        raise  # a busy device, not a lost one
    except RuntimeError as e:
        leave(f"{device} cannot be used ({str(e).splitlines()[0][:160]}): this rank leaves the elastic run")


def written_or_replanned(written: Any, elastic: Elastic | None) -> tuple[Plan | None, str | None]:
    """The recipe's written plan (``written()``: None under ``plan: auto``), or, in an elastic run where it does not
    run on this world, None (the planner then plans) and why the recipe's does not."""
    try:
        return written(), None
    except ConfigError as e:
        if elastic is None:
            raise
        return None, str(e)


def planned_or_stop(choose: Callable[[int], Any], world: int, output_dir: str, node: int = 1) -> Any:
    """``choose(world)``, the planner's choice for the ranks that remain; where it finds none, the one line that
    names the most ranks below (else the fewest above, up to twice this world) a plan runs on, in whole nodes of
    ``node`` ranks, and the checkpoint kept. At most ``TRIES`` counts each way are planned."""
    try:
        return choose(world)
    except ConfigError as e:
        why = str(e)

    def runs(n: int) -> bool:
        try:
            choose(n)
        except ConfigError:
            return False
        return True

    fewer = next((n for n in list(range(world - node, 0, -node))[:TRIES] if runs(n)), None)
    more = None if fewer else next((n for n in list(range(world + node, 2 * world + 1, node))[:TRIES] if runs(n)), None)
    if fewer:
        counts = f"plans run on {fewer} of them: start again with {fewer} rank(s)"
    elif more:
        counts = f"the fewest ranks a plan runs on is {more}: start again with {more} or more"
    else:
        counts = f"none runs on any count up to {2 * world} tried either"
    checkpoint = last_good_checkpoint(output_dir)
    raise ConfigError(f"elastic: no plan runs on the {world} rank(s) that remain ({why}); {counts}; {checkpoint}")


def _saved_plan(saved: dict[str, Any]) -> Plan | None:
    """A checkpoint's plan as a Plan (None: its fields as saved no longer make one)."""
    try:
        return Plan.from_dict(saved)
    except (TypeError, ValueError, KeyError):
        return None


def plan_words(saved: dict[str, Any]) -> str:
    """A checkpoint's plan in the plan line's words (its fields as saved, should they not make a plan today)."""
    from bigtrain.planner.names import describe

    plan = _saved_plan(saved)
    return describe(plan) if plan is not None else str(saved)


def replan_line(
    saved: Any,
    plan: Plan,
    world: int,
    predicted: Callable[..., str],
    why: str | None,
    output_dir: str = "",
    lost_at: float | None = None,
) -> str | None:
    """The one line of a start on another world (None when the checkpoint's world is this one; ``saved`` None: no
    checkpoint yet; the world of replica groups that are jobs of their own counts every group's ranks): the plans
    before and after and what the planner predicts of each (``predicted(plan, world)``), why the recipe's plan does
    not run (``why``, None: it does), the steps lost since the checkpoint and the seconds the restart took."""
    from bigtrain.planner.names import describe

    replanned = f", re-planned (the recipe's plan here: {why.split(';')[0]})" if why else ""
    if saved is None:
        return f"elastic: {world} rank(s), no checkpoint yet: plan {describe(plan)} ({predicted(plan)}){replanned}"
    old = _saved_plan(saved.plan)
    saved_world = saved.world_size * (old.dp_replicate if old is not None and survives_failures(old) else 1)
    if saved_world == world:
        return None
    before = f"{describe(old)} ({predicted(old, saved_world)})" if old is not None else str(saved.plan)
    lost = max(_last_logged_step(output_dir) - saved.step, 0)
    took = f", restarted in {time.time() - lost_at:.0f} s" if lost_at else ""
    return (
        f"elastic: {saved_world} -> {world} rank(s): plan {before} -> {describe(plan)} ({predicted(plan)})"
        f"{replanned}; resumed at step {saved.step}, {lost} step(s) lost since that checkpoint{took}"
    )


def _last_logged_step(output_dir: str) -> int:
    """The last step the run logged before it stopped (metrics.jsonl, read before this start rewrites it; replica
    groups that are jobs of their own log apart, and went on after group 0's last checkpoint too)."""
    last = 0
    for path in [Path(output_dir) / "metrics.jsonl", *Path(output_dir, GROUPS_FOLDER).glob("group*/metrics.jsonl")]:
        try:
            with path.open() as f:
                for line in f:
                    try:
                        last = max(last, int(json.loads(line).get("step", 0)))
                    except (ValueError, AttributeError, TypeError):
                        continue
        except OSError:
            continue
    return last
