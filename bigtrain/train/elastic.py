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

from bigtrain.config.plan import Plan
from bigtrain.errors import ConfigError

log = logging.getLogger("bigtrain")

EXIT_DEVICE_GONE = 8  # this rank's device is gone (or a drill says so): the launcher restarts without it
# an elastic worker stopped by a signal before the last step, after its checkpoint: not the run's end (a preempted
# node's peers stop with it, and their agent must start them again on the nodes that remain); a whole job that is
# stopped ends anyway, since its agents got the signal themselves
EXIT_STOPPED_EARLY = 9


@dataclass(frozen=True)
class Elastic:
    """What a worker of an elastic run is told by its launcher."""

    lose: tuple[int, int] | None = None  # --lose-rank: (rank, step) at which that rank leaves for good
    lost_at: float | None = None  # when the launcher saw the last loss (seconds since the epoch): the restart's time

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


def planned_or_stop(choose: Callable[[int], Any], world: int, output_dir: str) -> Any:
    """``choose(world)``, the planner's choice for the ranks that remain; where it finds none, the one line that
    names the rank counts it does find a plan for (up to twice this world) and the checkpoint kept."""
    try:
        return choose(world)
    except ConfigError as e:
        why = str(e)
    runs = []
    for n in range(1, 2 * world + 1):
        if n == world:
            continue
        try:
            choose(n)
        except ConfigError:
            continue
        runs.append(n)
    from bigtrain.cli.failures import last_good_checkpoint  # the words every stop uses for it

    fewer, more = [n for n in runs if n < world], [n for n in runs if n > world]
    if fewer:
        counts = f"plans run on {max(fewer)} of them: start again with {max(fewer)} rank(s)"
    elif more:
        counts = f"the fewest ranks a plan runs on is {min(more)}: start again with {min(more)} or more"
    else:
        counts = f"none runs on any count up to {2 * world} either"
    checkpoint = last_good_checkpoint(output_dir)
    raise ConfigError(f"elastic: no plan runs on the {world} rank(s) that remain ({why}); {counts}; {checkpoint}")


def replan_line(saved: Any, plan: Plan, world: int, predicted: Any, output_dir: str, elastic: Elastic) -> str | None:
    """The one line of a restart on another world (None when the checkpoint's world is this one): the plans before
    and after and what the planner predicts of each (``predicted(plan)``), the steps lost since the checkpoint and
    the seconds the restart took."""
    if saved.world_size == world:
        return None
    from bigtrain.planner.names import describe

    before = Plan.from_dict(saved.plan)
    lost = max(_last_logged_step(output_dir) - saved.step, 0)
    took = f", restarted in {time.time() - elastic.lost_at:.0f} s" if elastic.lost_at else ""
    return (
        f"elastic: {saved.world_size} -> {world} rank(s): plan {describe(before)} ({predicted(before)}) -> "
        f"{describe(plan)} ({predicted(plan)}); resumed at step {saved.step}, {lost} step(s) lost since that "
        f"checkpoint{took}"
    )


def _last_logged_step(output_dir: str) -> int:
    """The last step the run logged before it stopped (metrics.jsonl, read before this start rewrites it)."""
    path = Path(output_dir) / "metrics.jsonl"
    last = 0
    try:
        with path.open() as f:
            for line in f:
                try:
                    last = max(last, int(json.loads(line).get("step", 0)))
                except (ValueError, AttributeError):
                    continue
    except OSError:
        return 0
    return last
