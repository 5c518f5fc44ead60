"""``bigtrain train --nproc N --elastic`` on replica groups that survive failures (``parallel.replica_failures:
continue``): a group that cannot come back whole is left out, and the others go on as one group fewer.

Each group is a ``--nproc`` launcher of its own (``launch.run_replica_groups``), elastic within the group
(``elastic_launch.launch_elastic`` with ``--min-nproc`` all of the group's ranks): a rank that fails is started
again, and the group takes a healthy group's state when it rejoins, while torchft keeps the other groups training.
A group whose device is gone, or whose rank was killed twice in a row, cannot be whole again: its launcher exits
with ``EXIT_DEVICE_GONE``. This launcher then asks the others to stop (SIGTERM): they stop together after their
next synchronisation (``ReplicaSyncEngine.stop_here``), where every group holds the same weights and group 0 writes
its checkpoint. The run starts again as one group fewer (``parallel.dp_replicate``), its global batch kept (each
group reads a larger share of it, its accumulation recomputed), resumed from that checkpoint; the new groups but
group 0 take group 0's state at their first synchronisation, as a restarted group does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bigtrain.checkpoint.layout import checkpoints_dir, complete_checkpoints, last_good_checkpoint
from bigtrain.cli.launch import report_groups, run_replica_groups, visible_devices, write_line
from bigtrain.errors import ConfigError
from bigtrain.train.elastic import EXIT_DEVICE_GONE
from bigtrain.train.replica_groups import GROUP_RESTARTS


def launch_elastic_groups(
    nproc: int,
    groups: int,
    own_args: list[str],
    output_dir: str,
    limits: tuple[int, int, int],
    lose: tuple[int, int] | None,
    check_groups: Callable[[int], None],
) -> int:
    """Train on ``groups`` replica groups of ``nproc / groups`` local ranks each (and GPUs, where there are), fewer
    after each group lost for good (``limits``: --min-nproc, --max-restarts and train.steps; ``lose``: the drill's
    (rank, step), a rank of the whole run; ``check_groups(n)`` raises the ConfigError that refuses the recipe's plan
    on n groups)."""
    min_nproc, max_restarts, steps = limits
    per_group = nproc // groups
    devices = visible_devices(nproc)
    restarts, lost_at = 0, None
    while True:
        args = [*own_args, "--set", f"parallel.dp_replicate={groups}"] if restarts else list(own_args)
        args += ["--elastic", "--min-nproc", str(per_group), "--max-restarts", str(GROUP_RESTARTS)]
        args += ["--lost-at", f"{lost_at:.3f}"] if lost_at is not None else []
        drill = {lose[0] // per_group: ["--lose-rank", f"{lose[0] % per_group}@{lose[1]}"]} if lose else {}
        codes, asked = run_replica_groups(
            per_group,
            groups,
            lambda i, args=args, drill=drill: [*args, *drill.get(i, [])],
            output_dir,
            devices,
            lost_code=EXIT_DEVICE_GONE,
        )
        gone = [i for i, code in enumerate(codes) if code == EXIT_DEVICE_GONE]
        others = [code for i, code in enumerate(codes) if i not in gone]
        if not gone or asked or any(others):
            # the run ended, was stopped, or a group failed otherwise: said as without --elastic
            return report_groups(others if asked else codes, output_dir)
        what = "; ".join(_group_words(i, per_group) for i in gone) + " cannot come back whole"
        if _finished(output_dir, steps):  # the others finished the run meanwhile
            write_line(f"elastic: {what}; the other groups finished the run")
            return 0
        lost_at, lose = time.time(), None  # the drill's rank left with its group
        if devices is not None:  # the lost groups' GPUs stay out
            devices = [d for i in range(groups) if i not in gone for d in devices[i * per_group :][:per_group]]
        restarts += 1
        groups -= len(gone)
        stop = _why_stop(groups, per_group, min_nproc, restarts, max_restarts, check_groups)
        if stop is not None:
            write_line(f"error: {what}; {stop}; {last_good_checkpoint(output_dir)}")
            return EXIT_DEVICE_GONE
        write_line(
            f"elastic: {what}; the other groups were stopped (after their next synchronisation where it was near); "
            f"starting again as {groups} group(s) of {per_group} rank(s), the global batch kept, restart {restarts} "
            f"of at most {max_restarts} ({last_good_checkpoint(output_dir)})"
        )


def _group_words(index: int, per_group: int) -> str:
    ranks = f"rank(s) {index * per_group}-{(index + 1) * per_group - 1}" if per_group > 1 else f"rank {index}"
    return f"replica group {index} ({ranks})"


def _finished(output_dir: str, steps: int) -> bool:
    """Whether group 0's newest checkpoint is the run's last step."""
    found = complete_checkpoints(checkpoints_dir(output_dir))
    return bool(found) and found[-1][0] >= steps


def _why_stop(
    groups: int, per_group: int, min_nproc: int, restarts: int, max_restarts: int, check: Callable[[int], None]
) -> str | None:
    """Why the run cannot go on as ``groups`` groups (None: it can)."""
    if restarts > max_restarts:
        return f"--max-restarts={max_restarts} reached; start again to resume"
    if groups * per_group < min_nproc:
        return (
            f"{groups * per_group} rank(s) remain, fewer than --min-nproc={min_nproc}; start again with more to resume"
        )
    if groups < 2:
        return (
            "one group remains, and groups that survive failures need two: start again with "
            "parallel.replica_failures=stop to go on as one group"
        )
    try:
        check(groups)
    except ConfigError as e:
        return f"the recipe's plan does not run as {groups} groups ({str(e).split(';')[0]})"
    return None
