"""``bigtrain train --nproc N --elastic``: keep training when local ranks are lost, on the ranks that remain.

Each attempt is one ``--nproc`` launch through torch's elastic agent (``launch.run_workers``) on the devices still
in the run ("slots": GPU indices on CUDA, set through ``CUDA_VISIBLE_DEVICES``; labels on CPU). When a worker fails,
the agent stops the others; this launcher decides what is gone for good and starts again:
- a worker that exits with ``EXIT_DEVICE_GONE`` (its device cannot be used, or ``--lose-rank`` says so) takes its
  slot out at once;
- a worker that dies otherwise (a signal, a crash) is tried again on the same world; a slot whose worker failed
  ``SLOT_TRIES`` times in a row is taken out;
- a failure that is bigtrain's own line about the input (a bad recipe, a diverged loss) is not a lost device: the
  run stops with that line, as without ``--elastic``.
The workers start again with ``--elastic``: each resumes from the newest good checkpoint, re-planned where the
recipe's plan does not run on the ranks that remain (``train/elastic.py``). Limits: ``--min-nproc`` (fewer ranks
stop the run, its checkpoint kept) and ``--max-restarts``.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from bigtrain.cli.failures import EXIT_LOST_RANK, EXIT_NO_ANSWER, last_good_checkpoint
from bigtrain.cli.launch import own_code, own_line, run_workers, say_root_cause, visible_devices, write_line
from bigtrain.train.elastic import EXIT_DEVICE_GONE, EXIT_STOPPED_EARLY

SLOT_TRIES = 2  # a slot whose worker failed this many times in a row (not as a lost device) is taken as gone
# what a worker exits with when another rank's loss stopped it, or when the agent stopped it: not a cause
NOT_A_CAUSE = (EXIT_LOST_RANK, EXIT_NO_ANSWER, EXIT_STOPPED_EARLY, -signal.SIGTERM)


def launch_elastic(
    nproc: int,
    worker_args: list[str],
    output_dir: str,
    min_nproc: int,
    max_restarts: int,
    lose: tuple[int, int] | None = None,
    verbose: bool = False,
    lost_at: float | None = None,
) -> int:
    """Train on ``nproc`` local ranks, starting again on the ones that remain after each loss (at most
    ``max_restarts`` times, never on fewer than ``min_nproc``: then it exits with ``EXIT_DEVICE_GONE``); return the
    exit code. ``lost_at``: when a loss before this launch was seen (a replica group started again as fewer)."""
    slots = list(range(nproc))
    visible = visible_devices(nproc)
    strikes: Counter[int] = Counter()
    restarts = 0
    while True:
        args = [*worker_args, "--elastic"]
        if lose is not None and lose[0] in slots:  # the drill names a slot: its rank in this attempt
            args += ["--lose-rank", f"{slots.index(lose[0])}@{lose[1]}"]
        if lost_at is not None:
            args += ["--lost-at", f"{lost_at:.3f}"]
        if visible is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible[s] for s in slots)
        code, failures = run_workers(len(slots), args, verbose)
        if failures is None:
            return code
        lost_at = time.time()
        own = _input_failure(failures)
        if own is not None:  # bigtrain's own line about the run, not a device: said as without --elastic
            return say_root_cause(failures, output_dir)
        gone = _gone(failures, slots, strikes)
        restarts += 1
        remaining = [s for s in slots if s not in gone]
        what = _what_happened(failures, slots, gone)
        if restarts > max_restarts:
            write_line(
                f"error: {what}; --max-restarts={max_restarts} reached; {last_good_checkpoint(output_dir)}; start "
                "again to resume"
            )
            return code
        if len(remaining) < min_nproc and "--replica-group" in worker_args:  # the run's launcher says what follows
            group = worker_args[worker_args.index("--replica-group") + 1]
            write_line(f"error: {what}; replica group {group} cannot be whole again: it leaves the run")
            return EXIT_DEVICE_GONE
        if len(remaining) < min_nproc:
            write_line(
                f"error: {what}; {len(remaining)} rank(s) remain, fewer than --min-nproc={min_nproc}; "
                f"{last_good_checkpoint(output_dir)}; start again with more devices to resume"
            )
            return EXIT_DEVICE_GONE
        write_line(
            f"elastic: {what}; starting again on {len(remaining)} rank(s), restart {restarts} of at most "
            f"{max_restarts} ({last_good_checkpoint(output_dir)})"
        )
        slots = remaining


def _input_failure(failures: dict[int, ProcessFailure]) -> str | None:
    """A worker's own line that is about the run (bad input, a diverged loss), not about a lost rank."""
    for failure in failures.values():
        line = own_line(failure)
        if line is not None and own_code(failure) not in (EXIT_LOST_RANK, EXIT_NO_ANSWER, EXIT_DEVICE_GONE):
            return line
    return None


def _causes(failures: dict[int, ProcessFailure]) -> list[ProcessFailure]:
    """The failures that may be a device's: a worker killed by a signal of its own (SIGKILL from the OOM killer, a
    fault), among the first the agent saw. The agent records the workers it then stops too (SIGTERM, and SIGKILL
    after its grace period for one stuck in a collective with the dead rank): those come later and are not causes.
    A worker that exits with an error (a Python exception) is not a lost device either: it is tried again on the
    same world until --max-restarts."""
    first = min(f.timestamp for f in failures.values())
    return [f for f in failures.values() if f.timestamp == first and f.exitcode < 0 and f.exitcode not in NOT_A_CAUSE]


def _gone(failures: dict[int, ProcessFailure], slots: list[int], strikes: Counter[int]) -> set[int]:
    """The slots taken out after this attempt: a lost device at once, a slot whose worker was killed
    ``SLOT_TRIES`` times in a row; every other slot's count starts again."""
    gone = {slots[f.local_rank] for f in failures.values() if f.exitcode == EXIT_DEVICE_GONE}
    causes = {slots[f.local_rank] for f in _causes(failures)}
    for slot in slots:
        strikes[slot] = strikes[slot] + 1 if slot in causes else 0
        if strikes[slot] >= SLOT_TRIES:
            gone.add(slot)
    return gone


def _what_happened(failures: dict[int, ProcessFailure], slots: list[int], gone: set[int]) -> str:
    """The loss in words: which ranks (and slots) are gone, else which one failed and is tried again."""
    by_slot = {slots[f.local_rank]: (rank, f) for rank, f in failures.items()}
    if gone:
        named = ", ".join(f"rank {by_slot[s][0]} (device {s})" if s in by_slot else f"device {s}" for s in sorted(gone))
        return f"lost {named} for good"
    causes = [(rank, f) for rank, f in failures.items() if f.exitcode not in NOT_A_CAUSE]
    rank, failure = min(causes or failures.items(), key=lambda item: (item[1].timestamp, item[0]))
    how = f"killed by {signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0 else f"exit {failure.exitcode}"
    return f"rank {rank} failed ({how})"
