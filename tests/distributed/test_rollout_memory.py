"""grpo's two phases at real widths (8 ranks, bf16): the planner's rollout peak (prefill, last decode step, gathering
the first units) and its training peak each within 10% of bigtrain's own step simulated on fake tensors, for FSDP2
ZeRO-3 and ZeRO-2, DDP, LoRA, QLoRA and a sharded reference. ``python bench/rollout_memory.py`` prints the table
(bench/results/rollout_memory.md)."""

from __future__ import annotations

import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
from rollout_memory import ROLLOUT_MEMORY_CASES, run_case  # noqa: E402

# the default tier: a prefill-bound and a decode-bound rollout; the full tier DDP, and LoRA, the sharded reference and
# QLoRA at Llama-3-8B's width; the extended tier the rest (bench/rollout_memory.py prints them all)
DEFAULT, FULL = (0, 1), (4, 6, 7, 9)
TIERED = [
    pytest.param(c, marks=() if i in DEFAULT else pytest.mark.full if i in FULL else pytest.mark.extended)
    for i, c in enumerate(ROLLOUT_MEMORY_CASES)
]


@pytest.mark.parametrize("case", TIERED, ids=lambda c: c.name)
def test_each_phase_within_10_percent_of_simulation(case):
    r = run_case(case)
    for phase in ("generation", "training"):
        predicted, simulated = r[f"predicted_{phase}"], r[f"simulated_{phase}"]
        assert abs(predicted / simulated - 1) <= 0.10, (phase, predicted / 2**30, simulated / 2**30)
    assert r["predicted"] == max(r["predicted_generation"], r["predicted_training"])
    assert r["simulated"] == max(r["simulated_generation"], r["simulated_training"])


@pytest.mark.full
def test_the_kv_cache_is_what_a_longer_completion_adds():
    """Teeth of the cache term: 8k-token completions against 4k on the same plan (both peaking at the last decode
    step) add the cache's bytes for the 4k positions more (rows x positions x layers x 2 x kv_width x 2 bytes), and
    the copy of one layer's keys as the cache grows, to the simulated rollout, within 2%."""
    import dataclasses

    from cases import arch_config

    from bigtrain.planner.model_stats import ModelStats
    from bigtrain.planner.rollout_memory import kv_cache_bytes

    long = ROLLOUT_MEMORY_CASES[1]
    short = dataclasses.replace(long, completion=long.completion // 2)
    grown = run_case(long)["simulated_generation"] - run_case(short)["simulated_generation"]
    stats = ModelStats.from_config(arch_config(long.arch))
    more = kv_cache_bytes(stats, long.workload(), long.global_batch // 8, long.completion - short.completion)
    assert grown == pytest.approx(more * (1 + 1 / (2 * stats.layers)), rel=0.02)
