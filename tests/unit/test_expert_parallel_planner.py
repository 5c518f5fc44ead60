"""The planner's terms for expert parallelism (``parallel.ep``): what a rank gathers of a block, the all-to-all time,
and the search dimension (mixtures on fsdp2 only)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import make_plan

from bigtrain.config.workload import Workload
from bigtrain.planner.cost import ep_all_to_all_seconds, estimate_time
from bigtrain.planner.hardware import make_cluster
from bigtrain.planner.memory import estimate_memory
from bigtrain.planner.memory_terms import gathered_block_params
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.planner.search import search

WORKLOAD = Workload(seq_len=2048, global_batch_size=512, mixed_precision="bf16")


@pytest.fixture(scope="module")
def mixtral() -> ModelStats:
    return ModelStats.from_config(load_model_config("mixtral-8x7b"))


def test_a_rank_gathers_only_its_experts(mixtral):
    plan = make_plan(dp_shard=64, ep=8)
    experts = mixtral.expert_params
    assert experts > 0.9 * mixtral.block_params  # Mixtral's blocks are mostly experts
    assert gathered_block_params(mixtral, plan) == mixtral.block_params - experts + experts // 8
    assert gathered_block_params(mixtral, replace(plan, ep=1)) == mixtral.block_params
    # the model states are sharded over all 64 ranks either way; what shrinks is what a block gathers
    with_ep, without = estimate_memory(mixtral, plan, WORKLOAD), estimate_memory(mixtral, replace(plan, ep=1), WORKLOAD)
    assert with_ep.params_bytes == without.params_bytes and with_ep.optimizer_bytes == without.optimizer_bytes
    assert with_ep.total_bytes < without.total_bytes


def test_the_all_to_all_moves_top_k_copies_of_each_token_per_routed_block(mixtral):
    cluster = make_cluster(8, 8, "H100", "80GB")
    plan = make_plan(dp_shard=8, ep=4, micro_batch_size=2)
    seconds = ep_all_to_all_seconds(mixtral, plan, cluster, 2048, 2, micro_batches=4)
    pairs = 2 * 2 * 2048  # top-2 of each of a micro-batch's 2 x 2048 tokens
    per_block = 2 * (3 / 4) * 2 * pairs * 4096  # dispatch and combine, 3/4 leaving the rank, bf16
    want = 2 * 4 * 32 * per_block / (cluster.gpu.intra_node_gbps * 1e9)  # forward and backward, 4 micro-batches
    assert seconds == pytest.approx(want)
    assert ep_all_to_all_seconds(mixtral, replace(plan, ep=1), cluster, 2048, 2, 4) == 0
    full = replace(plan, activation_checkpointing="full")
    assert ep_all_to_all_seconds(mixtral, full, cluster, 2048, 2, 4) == pytest.approx(1.5 * want)  # the recompute's
    assert estimate_time(mixtral, plan, cluster, WORKLOAD).comm_s > 0


def test_the_search_weighs_ep_for_a_mixture_only(mixtral):
    cluster = make_cluster(16, 8, "H100", "80GB")
    degrees = {c.plan.ep for c in search(mixtral, cluster, WORKLOAD, fixed={"backend": "fsdp2", "pp": 1})}
    assert degrees == {1, 2, 4, 8}  # dividing dp_shard and the 8 experts, within a node
    dense = ModelStats.from_config(load_model_config("llama-3-8b"))
    assert {c.plan.ep for c in search(dense, cluster, WORKLOAD)} == {1}


def test_a_pinned_ep_that_does_not_fit_the_model_gets_the_table_s_words(mixtral):
    cluster = make_cluster(12, 12, "H100", "80GB")
    workload = Workload(seq_len=2048, global_batch_size=480, mixed_precision="bf16")
    candidates = search(mixtral, cluster, workload, fixed={"backend": "fsdp2", "ep": 3})
    assert not any(c.fits for c in candidates)
    reasons = {c.rejected_because for c in candidates}
    assert "parallel.ep=3 does not divide the 8 experts of mixtral; try 1, 2, 4, 8" in reasons
    dense = ModelStats.from_config(load_model_config("llama-3-8b"))
    reasons = {c.rejected_because for c in search(dense, cluster, workload, fixed={"backend": "fsdp2", "ep": 2})}
    assert "parallel.ep=2 splits a mixture's routed experts, and llama has none; unset it" in reasons
