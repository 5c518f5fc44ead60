"""The planner's DeepSpeed ZeRO memory terms against DeepSpeed's real step on 2 gloo ranks (bench/deepspeed_memory.py,
whose full table is bench/results/deepspeed_memory.md): within 10% for ZeRO-1, -2 (with accumulation) and -3."""

from __future__ import annotations

import json

from helpers import REPO, run_torchrun

CASES = (0, 2, 3, 6)  # ZeRO-1; ZeRO-2 with two micro-steps; ZeRO-3; ZeRO-2 with a large vocabulary


def test_deepspeed_memory_terms_match_the_measured_step():
    proc = run_torchrun([str(REPO / "bench/deepspeed_memory.py"), *map(str, CASES)], nproc=2, module=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith('{"case"')]
    assert [r["case"] for r in rows] == list(CASES)
    for r in rows:
        assert abs(r["predicted"] / r["measured"] - 1) <= 0.10, r
