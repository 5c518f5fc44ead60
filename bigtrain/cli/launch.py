"""``--nproc N``: start N local workers through torch's own elastic launcher (what torchrun runs), not our own spawner.

Each worker re-runs ``python -m bigtrain train ...`` without ``--nproc`` and finds RANK/WORLD_SIZE in its
environment. If a worker fails, the elastic agent stops the others, so nothing is left waiting.
"""

from __future__ import annotations

import os
import sys
import uuid

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch


def launch_local(nproc: int, worker_args: list[str]) -> int:
    """Run ``python -m bigtrain <worker_args>`` on ``nproc`` local ranks; return a process exit code."""
    if "OMP_NUM_THREADS" not in os.environ:
        # Same default as torchrun: N workers sharing the host's cores, one intra-op thread pool each.
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"bigtrain-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.5,
    )
    try:
        elastic_launch(config, sys.executable)("-u", "-m", "bigtrain", *worker_args)
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        return next((c for c in codes if c not in (0, None)), 1) if codes else 1
    return 0
