"""The pipelined plans' memory: the simulator runs bigtrain's pipelined step (torch's schedule, fake process group,
every pp rank), and the planner's per-rank terms (planner/pipeline_memory.py) predict its busiest rank within 10%."""

from __future__ import annotations

import sys

import pytest
from cases import MEMORY_ARCHS, PIPELINE_MEMORY_CASES
from helpers import REPO

from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import ParallelConfig, TrainConfig
from bigtrain.config.workload import Workload
from bigtrain.measure.simulate import simulate

sys.path.insert(0, str(REPO / "bench"))
from memory_matrix import run_case  # noqa: E402


@pytest.mark.parametrize("case", PIPELINE_MEMORY_CASES[:4], ids=lambda c: c.name)
def test_analytic_peak_of_the_busiest_pp_rank_within_10_percent_of_simulation(case):
    predicted, simulated = run_case(case)
    assert simulated > 0
    assert abs(predicted / simulated - 1) <= 0.10, (predicted, simulated)


def test_the_last_stage_does_not_keep_every_micro_batchs_logits():
    """torch's schedules keep the last stage's outputs for ``step()`` to return unless told not to: with a 152k
    vocabulary that was b·L·V compute-dtype bytes more per micro-batch. The engine asks for no outputs, so the last
    stage's peak does not grow with the micro-batches of a 1F1B step."""
    config = {**MEMORY_ARCHS["qwen2-bigvocab"], "num_hidden_layers": 2}
    plan = resolve_plan(ParallelConfig(pp=2), 2, TrainConfig(global_batch_size=2))
    few = simulate(config, plan, Workload(seq_len=256, global_batch_size=2, mixed_precision="bf16"))  # 2 micro-batches
    many = simulate(config, plan, Workload(seq_len=256, global_batch_size=8, mixed_precision="bf16"))  # 8 micro-batches
    assert few["pp_rank"] == many["pp_rank"] == 1  # the head's stage is the busiest
    logits_of_one = 256 * config["vocab_size"] * 2
    assert many["Total"] - few["Total"] < logits_of_one / 4, (few["Total"], many["Total"])
