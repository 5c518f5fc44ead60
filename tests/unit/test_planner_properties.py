"""Properties every pick of the planner must have, over grids of models, GPU counts and memory budgets:
- the pick's peak, measured on bigtrain's own step simulated on fake tensors, fits the GPU's memory;
- more memory per GPU never gives a slower pick (beyond the near-tie rule's 2%), and never loses a fit;
- a pick that offloads says so, with the host memory it needs and whether anything without offload fits.
(The arithmetic the picks rest on is tested term by term in test_planner.py and test_cost.py.)"""

from __future__ import annotations

import pytest
from cases import LLAMA_3_2_1B

from bigtrain.config.workload import Workload
from bigtrain.measure.simulate import simulate
from bigtrain.planner.explain import render_table
from bigtrain.planner.hardware import GiB, make_cluster
from bigtrain.planner.memory_terms import host_offload_bytes
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.planner.ranking import NEAR_TIE
from bigtrain.planner.search import search

BUDGETS_GIB = (12, 16, 24, 32, 40, 48, 64, 80, 96, 141)


def offloads(plan) -> bool:
    return plan.offload_params or plan.offload_optimizer


@pytest.mark.parametrize(("backend", "budgets_gib"), [("fsdp2", (10, 16, 40)), ("ddp", (16, 40))])
def test_the_picks_simulated_peak_fits_the_gpu(backend, budgets_gib):
    # 1B width and 128k vocabulary, 4 of its 16 blocks: the property holds at any depth, and the step simulates 4x
    # faster (a full-depth DDP step takes 20 s on fake tensors)
    config = load_model_config({**LLAMA_3_2_1B, "num_hidden_layers": 4})
    stats = ModelStats.from_config(config)
    peaks: dict = {}  # a plan picked under several budgets is simulated once
    for gib in budgets_gib:
        cluster = make_cluster(8, 8, "H100", f"{gib}GiB")
        best = search(stats, cluster, Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16"), fixed={"backend": backend})[0]
        if not best.fits or offloads(best.plan):  # offloaded states live on the host, which fake tensors do not tell
            continue
        if best.plan not in peaks:
            peaks[best.plan] = simulate(config, best.plan, Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16"))["Total"]
        assert peaks[best.plan] <= cluster.gpu.memory_bytes, (gib, best.plan, peaks[best.plan] / GiB)
    assert len(peaks) >= 2  # the property was exercised on different picks, not skipped


@pytest.mark.parametrize(
    ("model", "gpus", "seq", "batch"),
    [
        ("llama-3-8b", 8, 2048, 512),
        pytest.param("llama-3-8b", 64, 8192, 512, marks=pytest.mark.full),
        ("llama-3-70b", 16, 4096, 256),
        ("qwen2.5-7b", 8, 4096, 64),
        pytest.param("mistral-7b", 32, 2048, 1024, marks=pytest.mark.full),
        ("gpt2-xl", 8, 1024, 64),
    ],
)
def test_more_memory_never_gives_a_slower_pick(model, gpus, seq, batch):
    stats = ModelStats.from_config(load_model_config(model))
    previous = None
    for gib in BUDGETS_GIB:
        best = search(stats, make_cluster(gpus, 8, "H100", f"{gib}GiB"), Workload(seq_len=seq, global_batch_size=batch, mixed_precision="bf16"))[0]
        if previous is not None:
            assert best.fits or not previous.fits, f"fits at less memory than {gib} GiB but not at {gib} GiB"
            if previous.fits:
                assert best.time.step_s <= previous.time.step_s * (1 + NEAR_TIE), (gib, best.plan, previous.plan)
        previous = best


@pytest.mark.parametrize(
    ("model", "gpus", "gib"), [("llama-3-70b", 8, 80), ("llama-3-8b", 1, 80), ("qwen2.5-7b", 2, 40)]
)
def test_a_pick_that_offloads_says_so(model, gpus, gib):
    stats = ModelStats.from_config(load_model_config(model))
    cluster = make_cluster(gpus, 8, "H100", f"{gib}GiB")
    cands = search(stats, cluster, Workload(seq_len=2048, global_batch_size=8 * gpus, mixed_precision="bf16"))
    best = cands[0]
    assert best.fits and offloads(best.plan)
    host = host_offload_bytes(stats, best.plan)
    assert host >= 16 * stats.params // (best.plan.dp * 1.01)  # fp32 parameters, gradients and AdamW's states
    table = render_table(cands, stats, cluster, Workload(seq_len=2048, global_batch_size=8 * gpus))
    chosen = next(line for line in table.splitlines() if line.startswith("* "))
    assert "offload=" in chosen
    note = next(line for line in table.splitlines() if line.strip().startswith("offload:"))
    assert f"{host / GiB:.1f} GiB per GPU in host memory" in note
    without = [c for c in cands if c.fits and c.runnable and not offloads(c.plan)]
    assert ("no plan without offload fits" in note) == (not without)


def test_a_pick_without_offload_says_nothing_of_it():
    stats = ModelStats.from_config(load_model_config("llama-3-8b"))
    cluster = make_cluster(8, 8, "H100", "80GiB")
    cands = search(stats, cluster, Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16"))
    assert not offloads(cands[0].plan) and host_offload_bytes(stats, cands[0].plan) == 0
    assert "offload:" not in render_table(cands, stats, cluster, Workload(seq_len=2048, global_batch_size=64))
