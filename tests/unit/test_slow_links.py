"""The planner's terms for a slow link between replica groups (``planner/replica_sync_time.py``), each against numbers
worked out by hand here, and what it chooses: DiLoCo for Llama-3-8B over two sites at 10 Gb/s, synchronous training
at 400 Gb/s, and never a semi-synchronous plan without the link's figures."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import make_plan

from bigtrain.api.planning import plan
from bigtrain.config.capabilities import OPTIONS
from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.planner.hardware import Cluster, lookup_gpu, parse_bandwidth, parse_latency, replica_link_of
from bigtrain.planner.memory import estimate_memory
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.planner.replica_sync_time import (
    link_latency_seconds,
    outer_sync_seconds,
    outer_wait_per_step,
    pipeline_hop_seconds,
)

SITES = dict(sites=2, site_bandwidth="10Gb/s", site_latency="30ms")


@pytest.fixture(scope="module")
def llama8b() -> ModelStats:
    return ModelStats.from_config(load_model_config("llama-3-8b"))


def two_sites() -> Cluster:
    link = replica_link_of(16, 8, **SITES)
    return Cluster(lookup_gpu("H100"), 16, 8, replica_link=link)


def diloco(**options):
    p = make_plan(backend="fsdp2", zero_stage=2, dp_replicate=2, dp_shard=8, micro_batch_size=2)
    for name, value in {"sync": "diloco", **options}.items():
        p = p.with_option(name, value)
    return p


WORKLOAD = Workload(seq_len=2048, global_batch_size=512)


def test_bandwidths_and_delays_are_read_in_the_units_links_are_sold_in():
    assert parse_bandwidth("10Gb/s", "--x") == 1.25e9  # bits, decimal
    assert parse_bandwidth("100Gbps", "--x") == 12.5e9
    assert parse_bandwidth("12.5GB/s", "--x") == 12.5e9  # bytes
    assert parse_latency("30ms", "--x") == pytest.approx(0.03)
    assert parse_latency("25us", "--x") == pytest.approx(25e-6)
    link = two_sites().replica_link
    assert (link.groups, link.latency_s) == (2, pytest.approx(0.03))
    assert link.per_gpu(16) == 1.25e9 / 8  # the 8 GPUs of a site share its link


def test_one_synchronisation_moves_each_rank_s_shard_around_the_ring_of_sites(llama8b):
    cluster, p = two_sites(), diloco(sync_every=100)
    shard = llama8b.params / 8  # trained parameters per rank: the 8-way shard of the whole model
    by_hand = 2 * (1 / 2) * shard * 4 / (1.25e9 / 8)  # all-reduce of 2 groups, fp32, the site link's share per GPU
    by_hand += 2 * 1 * 0.03  # one fragment: 2 (R - 1) one-way delays
    by_hand += 2 * 4 * shard / 64e9  # the host-kept outer state in and out over PCIe Gen5
    assert outer_sync_seconds(llama8b, p, cluster, WORKLOAD) == pytest.approx(by_hand)
    in_bf16 = outer_sync_seconds(llama8b, diloco(sync_every=100, sync_dtype="bf16"), cluster, WORKLOAD)
    assert in_bf16 == pytest.approx(by_hand - shard * 4 / 2 / (1.25e9 / 8))  # half the bytes


def test_the_wait_is_the_sync_over_h_or_what_tau_inner_steps_do_not_hide(llama8b):
    cluster = two_sites()
    whole = outer_sync_seconds(llama8b, diloco(sync_every=100), cluster, WORKLOAD)
    assert outer_wait_per_step(llama8b, diloco(sync_every=100), cluster, WORKLOAD, 7.0) == pytest.approx(whole / 100)
    streamed = diloco(sync_every=100, fragments=4, fragment_delay=1)
    per_fragment = outer_sync_seconds(llama8b, streamed, cluster, WORKLOAD) / 4
    # tau = 1 step of 1 s hides 1 s of each fragment's transfer; 4 fragments per period of 100 steps
    assert outer_wait_per_step(llama8b, streamed, cluster, WORKLOAD, 1.0) == pytest.approx(4 * (per_fragment - 1) / 100)
    assert outer_wait_per_step(llama8b, streamed, cluster, WORKLOAD, per_fragment) == 0.0  # all of it hidden
    assert outer_wait_per_step(llama8b, make_plan(dp_replicate=2, dp_shard=8), cluster, WORKLOAD, 1.0) == 0.0


def test_every_step_training_pays_the_link_s_latency_per_collective_that_crosses_it(llama8b):
    cluster = two_sites()
    hsdp = make_plan(backend="fsdp2", zero_stage=2, dp_replicate=2, dp_shard=8)
    # the shards stay in a site; the all-reduce across the 2 sites runs per FSDP unit (32 blocks + the root)
    assert link_latency_seconds(llama8b, hsdp, cluster, 4, 1e9) == pytest.approx(33 * 2 * 1 * 0.03)
    ddp = make_plan(backend="ddp", zero_stage=0, dp_replicate=16, grad_reduce="once_per_step")
    buckets = -(-int(4e9) // (25 * 2**20))
    assert link_latency_seconds(llama8b, ddp, cluster, 4, 4e9) == pytest.approx(buckets * 2 * 15 * 0.03)
    assert link_latency_seconds(llama8b, diloco(), cluster, 4, 4e9) == 0.0  # nothing crosses between syncs
    one_site = Cluster(lookup_gpu("H100"), 16, 8)
    assert link_latency_seconds(llama8b, hsdp, one_site, 4, 4e9) == 0.0


def test_a_pipeline_across_sites_sends_every_micro_batch_over_the_link():
    cluster = two_sites()
    p = make_plan(backend="fsdp2", dp_shard=4, pp=4, grad_reduce="once_per_step")
    activation = 2 * 2048 * 4096 * 2  # mb 2 x seq x hidden x bf16
    # the boundary stage's 4 ranks share the 10 Gb/s; an activation and a gradient per micro-batch, each delayed
    by_hand = 2 * 64 * (activation / (1.25e9 / 4) + 0.03)
    assert pipeline_hop_seconds(p, cluster, 64, activation) == pytest.approx(by_hand)
    assert pipeline_hop_seconds(p, Cluster(lookup_gpu("H100"), 16, 8), 64, activation) is None


def test_the_outer_state_on_the_device_adds_8_bytes_per_trained_parameter_of_the_shard(llama8b):
    host, device = diloco(), diloco(outer_state="device")
    shard = llama8b.params / 8
    added = (
        estimate_memory(llama8b, device, WORKLOAD).other_bytes - estimate_memory(llama8b, host, WORKLOAD).other_bytes
    )
    assert added == pytest.approx(8 * shard, rel=1e-6)
    synchronous = make_plan(backend="fsdp2", zero_stage=2, dp_replicate=2, dp_shard=8, micro_batch_size=2)
    in_flight = (
        estimate_memory(llama8b, host, WORKLOAD).other_bytes
        - estimate_memory(llama8b, synchronous, WORKLOAD).other_bytes
    )
    assert in_flight == pytest.approx(8 * shard, rel=1e-6)  # one fragment (the whole model) in fp32, twice


LLAMA_3_8B_PARAMS = 8_030_261_248  # published (meta-llama/Meta-Llama-3-8B), typed by hand


def test_llama_8b_over_two_sites_streams_diloco_every_20_steps_because_nothing_is_left_to_wait_for():
    """By hand. One DiLoCo synchronisation all-reduces each rank's fp32 shard (8.03e9 / 8 parameters) between the
    2 sites: 2 x 1/2 x 4 bytes x 1.0038e9 over 10 Gb/s shared by a site's 8 GPUs (1.5625e8 B/s each) = 25.70 s, plus
    2 x 30 ms of delay and the host-kept outer state in and out over PCIe Gen5 (2 x 4 x 1.0038e9 / 64e9 = 0.125 s):
    T = 25.88 s. Streamed in 4 fragments, each fragment's 6.47 s overlaps tau = 4 inner steps (H = 20: min(5,
    20/4 - 1)). An inner step can be no faster than its matmuls at the H100's peak: 6 x 8.03e9 FLOPs x (256 rows x
    2048 tokens per site) / (8 x 989e12 FLOP/s) = 3.19 s, so 4 steps (>= 12.8 s) hide every fragment: no wait at any
    H, and among equally fast plans the shortest period (closest to synchronous training) is the one to choose.
    Unstreamed, H = 20 would wait T / 20 = 1.29 s a step. Every-step training would move the same 25.7 s of
    gradients over the link every step: far more than 20% of any step."""
    result = plan("llama-3-8b", gpus=16, gpu="H100", **SITES)
    sync = settings_of(result.plan)
    assert (sync.mode, sync.every, sync.fragments, sync.delay) == ("diloco", 20, 4, 4)
    assert result.plan.dp_replicate == 2 and result.plan.dp_shard == 8
    shard = LLAMA_3_8B_PARAMS / 8
    sync_s = 2 * 0.5 * 4 * shard / (1.25e9 / 8) + 2 * 0.03 + 2 * 4 * shard / 64e9
    assert sync_s == pytest.approx(25.88, abs=0.01)
    fastest_step = 6 * LLAMA_3_8B_PARAMS * 256 * 2048 / (8 * 989e12)
    assert sync_s / 4 < 4 * fastest_step  # each fragment hidden behind its 4 inner steps
    assert result.time.link_wait_s == 0.0 and result.time.step_s > fastest_step
    whole = next(c for c in result.searched if settings_of(c.plan) == dataclasses.replace(sync, fragments=1, delay=0)
                 and c.plan.with_option("fragments", 1).with_option("fragment_delay", 0)
                 == result.plan.with_option("fragments", 1).with_option("fragment_delay", 0))  # fmt: skip
    # what streaming saves: the whole synchronisation's wait, T / H a step (less the little the step's own traffic
    # already overlaps)
    assert whole.time.step_s - result.time.step_s == pytest.approx(sync_s / 20, rel=0.02)
    text = result.explain()
    assert "every-step training waits" in text and "semi-synchronous training is chosen above 20%" in text
    assert "arXiv 2311.08105" in text and "bigtrain has not measured the quality" in text


def test_at_400gbps_within_one_site_training_stays_synchronous():
    result = plan("llama-3-8b", gpus=16, gpu="H100", inter_node_bandwidth="400Gb/s")
    assert not settings_of(result.plan).semi_synchronous
    assert "semi-synchronous training is chosen above 20%" in result.explain()
    assert result.time.link_wait_s < 0.2 * result.time.step_s


def test_without_the_link_s_figures_no_semi_synchronous_plan_is_weighed():
    result = plan("llama-3-8b", gpus=16, gpu="H100", allow_unrunnable=True)
    assert not any(settings_of(c.plan).semi_synchronous for c in result.searched)
    pinned = plan("llama-3-8b", gpus=16, gpu="H100", fix={"sync": "diloco", "dp_replicate": 2, "sync_every": 50})
    assert settings_of(pinned.plan).every == 50  # asked for, it is planned


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(sites=3, site_bandwidth="10Gb/s"), "sites=3 must be at least 2 and divide the 16 GPUs"),
        (dict(site_bandwidth="10Gb/s"), "sites and site_bandwidth go together"),
        (dict(sites=2, site_bandwidth="10"), "is not a bandwidth; write e.g. 10Gb/s"),
        (dict(inter_node_latency="5us"), "inter_node_latency needs inter_node_bandwidth"),
        (dict(sites=2, site_bandwidth="10Gb/s", site_latency="soon"), "is not a delay"),
    ],
)
def test_bad_link_figures_get_one_line_naming_the_argument(kwargs, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        plan("llama-3-8b", gpus=16, gpu="H100", **kwargs)


def test_deepspeed_with_diloco_is_refused_by_the_sync_row_not_the_hybrid_one():
    from bigtrain.config.capabilities import Setup, first_problem

    p = make_plan(backend="deepspeed", zero_stage=2, dp_replicate=2, dp_shard=1, grad_reduce="every_micro_step")
    problem = first_problem(Setup(p.with_option("sync", "diloco")))
    assert (
        problem is not None and "parallel.sync=diloco with parallel.backend=deepspeed is not built" in problem.message
    )
    assert "sync" in OPTIONS
