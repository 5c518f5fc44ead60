"""dpo and orpo plans at Llama-3-8B's width (2 blocks, FSDP2 on 8 GPUs): the planner's peak within 10% of bigtrain's
own preference step simulated on fake tensors, for each reference (the sharded copy, offloaded, precomputed, the
adapter-disabled base with LoRA) and a reference-free objective; the sharded copy adds what the planner says it does.
``python bench/preference_memory.py`` prints the table (bench/results/preference_memory.md)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from cases import arch_config
from helpers import REPO

from bigtrain.planner.model_stats import ModelStats

sys.path.insert(0, str(REPO / "bench"))
from memory_matrix import run_case  # noqa: E402
from preference_memory import PREFERENCE_MEMORY_CASES  # noqa: E402


@pytest.fixture(scope="module")
def matrix() -> dict[str, tuple[int, int]]:
    """(predicted, simulated) of a case, simulated on first use (2-6 s each)."""
    cache: dict[str, tuple[int, int]] = {}

    class Lazy(dict):
        def __missing__(self, name: str) -> tuple[int, int]:
            cache[name] = run_case(next(c for c in PREFERENCE_MEMORY_CASES if c.name == name))
            return cache[name]

    return Lazy()


# the default tier: the sharded copy and the adapter-disabled base (and the copy's cost against the precomputed pass);
# the full tier every case
DEFAULT = ("-dpo-sharded-full-mb1", "-dpo-adapter_disabled-full-mb1")
TIERED = [
    pytest.param(c, marks=() if any(d in c.name for d in DEFAULT) and "fsdp23" in c.name else pytest.mark.full)
    for c in PREFERENCE_MEMORY_CASES
]


def test_every_reference_is_measured():
    refs = {(c.method, c.reference) for c in PREFERENCE_MEMORY_CASES if c.objective == "dpo"}
    assert {r for _, r in refs} == {"sharded", "offloaded", "precomputed", "adapter_disabled"}
    assert {m for m, _ in refs} == {"full", "lora"}


@pytest.mark.parametrize("case", TIERED, ids=lambda c: c.name)
def test_preference_peak_within_10_percent_of_simulation(case, matrix):
    predicted, simulated = matrix[case.name]
    assert abs(predicted / simulated - 1) <= 0.10, (predicted / 2**30, simulated / 2**30)


def test_the_sharded_copy_costs_what_the_planner_says(matrix):
    """The simulated difference between the sharded and the precomputed reference of one plan is the frozen copy's
    bf16 shard (the teeth of the term: an fp32 copy, or a root unit left gathered, would double it)."""
    by_ref = {c.reference: c for c in PREFERENCE_MEMORY_CASES if c.method == "full" and c.ac == "full"}
    sharded, precomputed = (matrix[by_ref[r].name][1] for r in ("sharded", "precomputed"))
    stats = ModelStats.from_config(arch_config(by_ref["sharded"].arch))
    copy = stats.params * 2 / 8
    assert sharded - precomputed == pytest.approx(copy, rel=0.05)
    sft = dataclasses.replace(by_ref["precomputed"], objective="sft", global_batch=32, micro_batch=2)
    # a pair is two rows: nothing else changes in the step's memory (but the reference log-probabilities, bytes)
    assert run_case(sft)[1] == pytest.approx(precomputed, abs=1024)
