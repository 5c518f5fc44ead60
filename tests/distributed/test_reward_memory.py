"""The reward model's planned peak is within 10% of bigtrain's own step simulated on fake tensors
(bench/reward_memory.py's cases: Llama-3-8B's and Mistral-7B's widths cut in depth, Qwen2.5-0.5B whole; FSDP2 zero2
and zero3, DDP, full and LoRA)."""

from __future__ import annotations

import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
from reward_memory import CASES, run_case  # noqa: E402

# CI's case (the full tier): Llama-3-8B's width, whose 128k-token embedding outweighs a block; the others are the
# extended tier's, as bench/reward_memory.py prints them all
TIERED = [
    pytest.param(c, id=c.name, marks=pytest.mark.full if i == 0 else pytest.mark.extended) for i, c in enumerate(CASES)
]


@pytest.mark.parametrize("case", TIERED)
def test_reward_model_peak_within_10_percent_of_the_simulated_step(case):
    predicted, simulated = run_case(case)
    assert simulated > 0
    assert abs(predicted / simulated - 1) <= 0.10, f"{case.name}: {predicted / 2**30:.2f} vs {simulated / 2**30:.2f}"
