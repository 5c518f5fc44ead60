"""A ``bigtrain probe`` profile as the planner's hardware (planner/profile.py): measured rates and links replace the
table's in the time model; bad files are one clear error."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import ParallelConfig, TrainConfig
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.planner.auto import CPU, choose_plan
from bigtrain.planner.cost import estimate_time
from bigtrain.planner.hardware import Cluster, lookup_gpu
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.planner.profile import gpu_from_profile, link_gbps, load_profile, measured_rate

PROFILE = {
    "device": "cpu (x86_64)",
    "torch": "2.13.0+cpu",
    "date": "2026-11-23",
    "matmul": [
        {"dtype": "fp32", "m": 256, "k": 256, "n": 256, "tflops": 0.05},
        {"dtype": "fp32", "m": 1024, "k": 1024, "n": 1024, "tflops": 0.10},
        {"dtype": "bf16", "m": 1024, "k": 1024, "n": 1024, "tflops": 0.20},
    ],
    "collectives": [
        {"op": "all_gather", "ranks": 2, "mib": 1, "bus_gbps": 0.1},
        {"op": "all_gather", "ranks": 2, "mib": 16, "bus_gbps": 0.6},
        {"op": "reduce_scatter", "ranks": 2, "mib": 16, "bus_gbps": 0.4},
        {"op": "all_reduce", "ranks": 2, "mib": 16, "bus_gbps": 1.0},
    ],
}


def test_rates_are_read_at_the_nearest_shape_and_links_from_the_largest_collectives():
    gpu = gpu_from_profile(PROFILE, replace(CPU, memory_bytes=2**33))
    assert measured_rate(gpu, "fp32", 200) == 0.05 and measured_rate(gpu, "fp32", 800) == 0.10
    assert measured_rate(gpu, "bf16", 1) == 0.20 and measured_rate(gpu, "fp16", 1024) is None
    assert link_gbps(PROFILE) == 0.6 and gpu.intra_node_gbps == 0.6  # median of 0.4, 0.6, 1.0 at 16 MiB
    assert gpu.memory_bytes == 2**33 and gpu.name == "cpu (x86_64)"
    # no copy rate in this profile: element-wise work stays unmodelled; a CPU's gloo shares the computing cores
    assert gpu.copy_gbps == 0.0 and not gpu.overlaps_comm
    gpu = gpu_from_profile({**PROFILE, "device": "NVIDIA H200", "copy_gbps": 4143.2}, lookup_gpu("H200"))
    assert gpu.copy_gbps == 4143.2 and gpu.overlaps_comm and gpu.op_overhead_s == 5e-6
    gpu = gpu_from_profile({**PROFILE, "op_overhead_s": 2e-5}, CPU)
    assert gpu.op_overhead_s == 2e-5  # measured by bigtrain probe


def test_the_profile_sets_the_predicted_step_time():
    # compute time is FLOPs over the measured rate: the hand-computed 6·N·tokens + attention at 0.10 TFLOP/s
    stats = ModelStats.from_config(load_model_config("gpt2"))
    plan = resolve_plan(ParallelConfig(backend="ddp", micro_batch_size=1), 1, TrainConfig(global_batch_size=1))
    gpu = gpu_from_profile(PROFILE, replace(CPU, memory_bytes=2**33))
    t = estimate_time(
        stats, plan, Cluster(gpu, 1, 1), Workload(seq_len=1024, global_batch_size=1, mixed_precision="fp32")
    )
    flops = 6 * (stats.layers * stats.block_params + stats.vocab * stats.hidden) + 12 * stats.layers * 1024 * 768
    floor = 12 * 60 * 5e-6  # the launch floor: 12 blocks x 60 operators x 5 us (the profile measured none)
    assert t.compute_s == pytest.approx(flops * 1024 / 0.10e12 + floor, rel=1e-9)
    faster = gpu_from_profile({**PROFILE, "matmul": [{"dtype": "fp32", "m": 1024, "tflops": 0.20}]}, CPU)
    assert estimate_time(
        stats, plan, Cluster(faster, 1, 1), Workload(seq_len=1024, global_batch_size=1, mixed_precision="fp32")
    ).compute_s == pytest.approx((t.compute_s - floor) / 2 + floor)


def test_a_known_gpu_keeps_its_datasheet_peak_for_mfu():
    h100 = lookup_gpu("H100")
    gpu = gpu_from_profile({**PROFILE, "device": "NVIDIA H100 80GB HBM3", "memory_bytes": 85e9}, h100)
    assert gpu.peak_tflops == h100.peak_tflops and gpu.memory_bytes == 85_000_000_000


def test_plan_auto_ranks_with_the_profile():
    config = load_model_config("gpt2")
    plain = choose_plan(
        config, 2, 2, None, 2**34, Workload(seq_len=256, global_batch_size=8, mixed_precision="fp32")
    ).table
    probed = choose_plan(
        config, 2, 2, None, 2**34, Workload(seq_len=256, global_batch_size=8, mixed_precision="fp32"), PROFILE
    ).table
    assert "cpu (x86_64)" in probed and plain != probed


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist; write one with bigtrain probe"),
        ("{not json", "is not JSON"),
        (json.dumps({"device": "x"}), "has no matmul rates"),
    ],
)
def test_bad_profiles_are_one_clear_error(tmp_path, content, message):
    path = tmp_path / "profile.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_profile(path)
