"""The planner's pipelined memory and time terms against hand-computed numbers (planner/pipeline_memory.py, cost.py)."""

from __future__ import annotations

import dataclasses

import pytest

from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import ParallelConfig, TrainConfig
from bigtrain.config.workload import Workload
from bigtrain.planner.cost import estimate_time
from bigtrain.planner.hardware import make_cluster
from bigtrain.planner.memory import estimate_memory
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.planner.pipeline_memory import estimate_pipeline_rank, stages_in_flight
from bigtrain.planner.search import search


def _plan(**kw):
    return resolve_plan(ParallelConfig(**kw), kw.get("pp", 1) * kw.get("dp_shard", 1), TrainConfig(global_batch_size=64))


def test_micro_batches_in_flight_follow_each_schedule():
    one_f_one_b = _plan(pp=4)
    assert [stages_in_flight(one_f_one_b, r, 8) for r in range(4)] == [4, 3, 2, 1]
    assert [stages_in_flight(one_f_one_b, r, 2) for r in range(4)] == [2, 2, 2, 1]  # never more than exist
    gpipe = _plan(pp=4, pp_schedule="gpipe")
    assert {stages_in_flight(gpipe, r, 8) for r in range(4)} == {8}
    # torch's Interleaved1F1B warm-up: (v - 1)·p + 2(p - 1 - r) + 1 stage-chunks, at most m·v
    interleaved = _plan(pp=4, pp_schedule="interleaved_1f1b", pp_virtual_stages=2)
    assert [stages_in_flight(interleaved, r, 8) for r in range(4)] == [11, 9, 7, 5]
    assert stages_in_flight(interleaved, 0, 4) == 8


def test_each_rank_holds_its_own_stage_and_the_busiest_is_returned():
    stats = ModelStats.from_config(load_model_config("llama-3-8b"))  # untied, 32 layers
    plan = _plan(pp=4, dp_shard=2)
    ranks = [estimate_pipeline_rank(stats, plan, r, Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16")) for r in range(4)]
    blocks = 8 * stats.block_params
    # 4 bytes of sharded fp32 parameters per parameter, over dp_shard=2
    assert ranks[0].params_bytes == 4 * (blocks + stats.embed_params) // 2
    assert ranks[1].params_bytes == ranks[2].params_bytes == 4 * blocks // 2
    assert ranks[3].params_bytes == 4 * (blocks + stats.head_params + stats.norm_params) // 2
    # the first rank keeps 4 micro-batches in flight, the inner ones fewer
    assert ranks[0].activations_bytes > ranks[1].activations_bytes > ranks[2].activations_bytes
    assert estimate_memory(stats, plan, Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16")) == max(ranks, key=lambda e: e.total_bytes)


def test_pipelined_plans_are_offered_by_the_planner():
    """pp's memory terms are checked against the simulator: its plans are runnable candidates, ranked by time."""
    stats = ModelStats.from_config(load_model_config("llama-3-8b"))
    candidates = search(stats, make_cluster(16, 8, "H100", "80GB"), Workload(seq_len=2048, global_batch_size=512, mixed_precision="bf16"), fixed={"pp": 2})
    assert candidates[0].runnable and candidates[0].fits and candidates[0].plan.pp == 2
    gpipe = [c for c in candidates if c.plan.pp_schedule == "gpipe"]
    same_1f1b = {
        dataclasses.replace(c.plan, pp_schedule="gpipe"): c for c in candidates if c.plan.pp_schedule == "1f1b"
    }
    # GPipe keeps every micro-batch in flight: never less memory than 1F1B of the same shape
    assert gpipe and all(c.memory.total_bytes >= same_1f1b[c.plan].memory.total_bytes for c in gpipe)


def test_the_pipeline_bubble_is_p_minus_1_slots_of_a_stage_chunk():
    """(v·m + p - 1) / (v·m) of the bubble-free compute: 1F1B with m = 64 micro-batches on p = 4 ranks, and
    interleaved 1F1B with v = 2 stages per rank, whose slots are half as long."""
    stats = ModelStats.from_config(load_model_config("llama-3-8b"))
    cluster = make_cluster(4, 8, "H100", "80GB")
    no_pp = estimate_time(stats, _plan(dp_shard=4), cluster, Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16")).compute_s
    one_f_one_b = estimate_time(stats, _plan(pp=4), cluster, Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16")).compute_s
    interleaved = _plan(pp=4, pp_schedule="interleaved_1f1b", pp_virtual_stages=2)
    looped = estimate_time(stats, interleaved, cluster, Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16")).compute_s
    # dp_shard=4 runs 16 micro-batches of the same size per rank, pp=4 runs 64 micro-batches through 1/4 of the model
    assert one_f_one_b / no_pp == pytest.approx(67 / 64)
    assert looped / no_pp == pytest.approx(131 / 128)
