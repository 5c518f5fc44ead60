"""``--nproc N``: start N local workers through torch's own elastic launcher (what torchrun runs), not our own spawner.

Each worker re-runs ``python -m bigtrain train ...`` without ``--nproc`` and finds RANK/WORLD_SIZE in its
environment. If a worker fails, the elastic agent stops the others, so nothing is left waiting; this launcher then
prints the root cause once (the lowest rank's own line, or which rank died of which signal) with the last good
checkpoint, instead of every rank's line and the agent's log. On SIGTERM or Ctrl-C the agent passes the signal to
the workers and waits up to ``SHUTDOWN_S`` for them to checkpoint and stop (``train/preemption.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from bigtrain.cli.failures import EXIT_AFTER, EXIT_NO_ANSWER, last_good_checkpoint
from bigtrain.errors import ConfigError

# torchft's Lighthouse: how long a synchronisation waits for a live group that has not asked yet (a slow group is
# waited for, as synchronous training would; a group that synchronised alone would go on from other weights), and
# after how long a silent group counts as dead (then the others synchronise without it)
LIGHTHOUSE_JOIN_MS = 300_000
HEARTBEAT_TIMEOUT_MS = 5000
# how long the workers get to finish their step and write a checkpoint after SIGTERM or Ctrl-C before the agent
# kills them (torch's default is 30 s, shorter than a large model's checkpoint)
SHUTDOWN_S = 300


def launch_local(
    nproc: int, worker_args: list[str], output_dir: str | None = None, verbose: bool = False, max_restarts: int = 0
) -> int:
    """Run ``python -m bigtrain <worker_args>`` on ``nproc`` local ranks; return a process exit code.
    ``max_restarts``: how often the agent starts the workers again after one died (a replica group's job)."""
    code, failures = run_workers(nproc, worker_args, verbose, max_restarts)
    return code if failures is None else say_root_cause(failures, output_dir)


def run_workers(
    nproc: int, worker_args: list[str], verbose: bool = False, max_restarts: int = 0
) -> tuple[int, dict[int, ProcessFailure] | None]:
    """``python -m bigtrain <worker_args>`` on ``nproc`` local ranks under torch's elastic agent: (exit code, None)
    when they ended or were stopped by a signal, (1, each failed rank's failure) when one failed."""
    if "OMP_NUM_THREADS" not in os.environ:
        # Same default as torchrun: N workers sharing the host's cores, one intra-op thread pool each.
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    if not verbose:  # the agent logs each worker's stop and failure; the root cause is said below instead
        for name in list(logging.root.manager.loggerDict):  # each of its modules sets its own logger's level
            if name.startswith("torch.distributed.elastic"):
                logging.getLogger(name).setLevel(logging.CRITICAL)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"bigtrain-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=max_restarts,
        monitor_interval=0.5,
        **_shutdown_timeout(),
    )
    try:
        elastic_launch(config, sys.executable)("-u", "-m", "bigtrain", *worker_args)
    except SignalException as e:  # the workers said how they stopped (a checkpoint, or not)
        return EXIT_AFTER.get(e.sigval, 128 + int(e.sigval)), None
    except ChildFailedError as e:
        return 1, e.failures
    return 0, None


def _shutdown_timeout() -> dict[str, int]:
    """``shutdown_timeout=SHUTDOWN_S`` where this torch's LaunchConfig has the field (2.13 has it, 2.11 has not: seen
    on an H100 image, where every ``--nproc`` launch failed on the keyword). Without it the agent waits torch's own
    30 s for the workers' checkpoint after a signal."""
    names = {f.name for f in dataclasses.fields(LaunchConfig)}
    return {"shutdown_timeout": SHUTDOWN_S} if "shutdown_timeout" in names else {}


def launch_replica_groups(nproc: int, groups: int, own_args: list[str], output_dir: str) -> int:
    """``parallel.replica_failures: continue``: torchft's Lighthouse in this process, and one ``--nproc`` launcher per
    replica group (``nproc / groups`` ranks each, its workers started again when one dies), which find the
    Lighthouse where torchft looks (TORCHFT_LIGHTHOUSE). Group 0 prints to this terminal; group i > 0 to
    ``output_dir/replica_groups/group<i>.log``. Returns the first failing group's exit code, else 0."""
    codes, _ = run_replica_groups(nproc // groups, groups, lambda index: own_args, output_dir, visible_devices(nproc))
    return report_groups(codes, output_dir)


def run_replica_groups(
    per_group: int,
    groups: int,
    args_of: Callable[[int], list[str]],
    output_dir: str,
    devices: list[str] | None = None,
    lost_code: int | None = None,
) -> tuple[list[int], bool]:
    """Run ``groups`` replica groups of ``per_group`` ranks (group i: ``bigtrain <args_of(i)> --nproc per_group
    --replica-group i``, on ``devices[i * per_group:][:per_group]`` where GPUs are given) until they end: each group's
    exit code, and whether this launcher was asked to stop (SIGTERM, passed on to the groups). With ``lost_code``:
    once a group exits with it (it cannot come back whole), the others are asked to stop (SIGTERM: after their next
    synchronisation, with a checkpoint)."""
    os.environ.setdefault("RUST_LOG", "warn")  # torchft logs its quorum and commit lines at every synchronisation
    if "OMP_NUM_THREADS" not in os.environ:  # as launch_local does, for every rank of every group
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // (per_group * groups)))
    from torchft._torchft import LighthouseServer

    from bigtrain.train.replica_groups import GROUPS_FOLDER

    lighthouse = LighthouseServer(
        bind="[::]:0", min_replicas=1, join_timeout_ms=LIGHTHOUSE_JOIN_MS, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS
    )
    env = {**os.environ, "TORCHFT_LIGHTHOUSE": lighthouse.address()}
    logs = Path(output_dir) / GROUPS_FOLDER
    logs.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[subprocess.Popen, Any]] = []
    asked: list[int] = []

    def stop(signum: int, frame: Any) -> None:  # each group's launcher passes it to its workers, which checkpoint
        asked.append(signum)
        for job, _ in jobs:
            job.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        for index in range(groups):
            command = [sys.executable, "-m", "bigtrain", *args_of(index), "--nproc", str(per_group)]
            command += ["--replica-group", str(index)]
            own = dict(env)
            if devices is not None:  # each group its own GPUs
                own["CUDA_VISIBLE_DEVICES"] = ",".join(devices[index * per_group :][:per_group])
            out = None if index == 0 else open(logs / f"group{index}.log", "a")  # noqa: SIM115 (closed below)
            jobs.append((subprocess.Popen(command, env=own, stdout=out, stderr=out), out))
        told = False
        while any(job.poll() is None for job, _ in jobs):
            if not told and lost_code is not None and any(job.poll() == lost_code for job, _ in jobs):
                told = True
                for job, _ in jobs:
                    if job.poll() is None:
                        job.send_signal(signal.SIGTERM)
            time.sleep(0.2)
        codes = [job.wait() for job, _ in jobs]
    finally:
        signal.signal(signal.SIGTERM, previous)
        for job, out in jobs:
            if job.poll() is None:
                job.terminate()
                job.wait()
            if out is not None:
                out.close()
        lighthouse.shutdown()
    return codes, bool(asked)


def visible_devices(nproc: int) -> list[str] | None:
    """The GPUs the slots stand for (``CUDA_VISIBLE_DEVICES`` as given, else 0..N-1); None on a machine without
    CUDA (asked without creating a CUDA context in this process)."""
    import torch

    if not torch.cuda.is_available():
        return None
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = given.split(",") if given else [str(i) for i in range(torch.cuda.device_count())]
    if len(devices) < nproc:
        raise ConfigError(
            f"--nproc={nproc} with {len(devices)} GPU(s) visible (CUDA_VISIBLE_DEVICES={given!r}): one rank per GPU; "
            f"use --nproc {len(devices)} or show more GPUs"
        )
    return devices[:nproc]


def report_groups(codes: list[int], output_dir: str) -> int:
    """The first failing group's exit code, said in one line with where its output is; 0 when none failed."""
    failed = [(i, code) for i, code in enumerate(codes) if code]
    if not failed:
        return 0
    index, code = failed[0]
    where = "above" if index == 0 else f"in {Path(output_dir) / 'replica_groups' / f'group{index}.log'}"
    write_line(f"replica group {index} exited with code {code} (its output is {where})")
    return code


def say_root_cause(failures: dict[int, ProcessFailure], output_dir: str | None) -> int:
    """Print why the job stopped, once, and return the exit code it ends with."""
    if not failures:
        return 1
    # a rank that died of a signal (kill -9, the OOM killer, a crash) is the cause: the others only lost contact with
    # it; SIGTERM is what the agent stops the others with, so a rank it ended is a cause only when nothing else is
    # (SIGABRT last among them: a process aborting at exit after its peer vanished)
    killed = sorted(
        (-f.exitcode == signal.SIGABRT, f.timestamp, rank)
        for rank, f in failures.items()
        if f.exitcode < 0 and -f.exitcode != signal.SIGTERM
    )
    said = sorted(rank for rank, f in failures.items() if own_line(f))
    waited = [rank for rank in said if own_code(failures[rank]) == EXIT_NO_ANSWER]
    silent = sorted(rank for rank, f in failures.items() if -f.exitcode == signal.SIGKILL)
    if waited and silent:
        # a rank gave up waiting for another in a collective, and the agent then had to kill the one that answered
        # neither the collective nor its SIGTERM (stopped, or hung outside Python): that one is the cause
        who = ", ".join(f"rank {r} (pid {failures[r].pid} on {socket.gethostname()})" for r in silent)
        write_line(
            f"error: {who} stopped answering: rank {waited[0]} waited train.collective_timeout_s for it in a "
            f"collective, and it was then killed (hung or stopped); {last_good_checkpoint(output_dir)}; start again "
            "to resume"
        )
        return EXIT_NO_ANSWER
    if not killed and not said:
        killed = sorted((False, f.timestamp, rank) for rank, f in failures.items() if f.exitcode < 0)
    if killed:
        rank = killed[0][-1]
        failure = failures[rank]
        name = signal.Signals(-failure.exitcode).name
        write_line(
            f"error: rank {rank} (pid {failure.pid} on {socket.gethostname()}) was killed by {name}; the other ranks "
            f"were stopped; {last_good_checkpoint(output_dir)}; start again to resume"
        )
        return 128 - failure.exitcode
    if said:  # bigtrain's own line from the lowest rank that wrote one (every rank refusing the same recipe, say)
        failure = failures[said[0]]
        write_line(own_line(failure) or "")
        return own_code(failure)
    rank = min(failures)
    write_line(
        f"error: rank {rank} exited with code {failures[rank].exitcode} (its output is above); "
        f"{last_good_checkpoint(output_dir)}"
    )
    return failures[rank].exitcode or 1


def own_line(failure: ProcessFailure) -> str | None:
    """The line a worker wrote to its error file (``cli/failures.say``), if it wrote one."""
    message = failure.error_file_data.get("message") if isinstance(failure.error_file_data, dict) else None
    return message.get("message") if isinstance(message, dict) else None


def own_code(failure: ProcessFailure) -> int:
    """The exit code a worker wrote beside its line (``cli/failures.say``)."""
    return int(failure.error_file_data["message"]["extraInfo"].get("exitcode", 1))


def write_line(line: str) -> None:
    sys.stderr.flush()
    os.write(2, f"\nbigtrain: {line}\n".encode())
