"""docs/accuracy.md's CPU benchmark commands (its ``bench-*`` blocks), run as written: ``python -m pytest -m bench``
(about 30 minutes on 2 cores; not in the CI suite: its extended tier asserts the same cases as memory_matrix.py).
Each benchmark rewrites its results in bench/results/, as its doc says."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from helpers import REPO, docs_blocks

COMMANDS = [command for name, (_, commands) in docs_blocks().items() if name.startswith("bench-") for command in commands]


@pytest.mark.bench
@pytest.mark.parametrize("command", COMMANDS)
def test_the_benchmark_runs_as_written(command):
    args = shlex.split(command)
    if args[0] == "python":
        args[0] = sys.executable
    elif args[0] == "torchrun":
        args = [sys.executable, "-m", "torch.distributed.run", *args[1:]]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
