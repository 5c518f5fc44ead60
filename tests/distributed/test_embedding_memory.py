"""The embedding model's planned peak is within 10% of bigtrain's own contrastive step simulated on fake tensors, the
gradient cache's pass included (bench/embedding_memory.py's cases: e5-mistral-7b's width cut in depth on FSDP2 zero3
and, with LoRA, zero2; ModernBERT-large whole on DDP)."""

from __future__ import annotations

import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
from embedding_memory import CASES, run_case  # noqa: E402

# CI's cases (the full tier): the 7 B decoder's width, full and LoRA (seconds each); ModernBERT-large whole (its 28
# blocks measured at 512 tokens take ~40 s) is the extended tier's, as bench/embedding_memory.py prints them all
TIERED = [pytest.param(c, id=c.name, marks=pytest.mark.full if c.layers else pytest.mark.extended) for c in CASES]


@pytest.mark.parametrize("case", TIERED)
def test_embedding_model_peak_within_10_percent_of_the_simulated_step(case):
    predicted, simulated = run_case(case)
    assert simulated > 0
    assert abs(predicted / simulated - 1) <= 0.10, f"{case.name}: {predicted / 2**30:.2f} vs {simulated / 2**30:.2f}"
