"""The planner's train.compile and train.fp8 terms against numbers worked out by hand (planner/cost.py,
planner/memory_terms.py, planner/hardware.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import ParallelConfig
from bigtrain.config.workload import Workload
from bigtrain.planner import cost
from bigtrain.planner.hardware import lookup_gpu, make_cluster
from bigtrain.planner.memory import estimate_memory
from bigtrain.planner.memory_terms import activation_bytes, logits_bytes
from bigtrain.planner.model_stats import ModelStats

# Llama-3.2-1B's widths at 2 layers (untied): h 2048, ffn 8192, kv width 512, vocab 128256
CONFIG = dict(
    model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=32,
    num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False,
)


def _plan(workload: Workload, tp: int = 1):
    world = tp
    return resolve_plan(ParallelConfig(backend="fsdp2", zero_stage=2, micro_batch_size=4, tp=tp), world,
                        workload.train_config())


def test_fp8_peaks_by_gpu():
    assert lookup_gpu("H100").fp8_tflops == 1979.0
    assert lookup_gpu("NVIDIA H100 80GB HBM3").fp8_tflops == 1979.0
    assert lookup_gpu("L4").fp8_tflops == 242.0
    assert lookup_gpu("A100").fp8_tflops == 0.0  # no FP8 tensor cores
    cluster = make_cluster(1, None, "A100")
    assert cost.fp8_peak(cluster, "rowwise", 8192, 1.0) == 0.0
    h100 = make_cluster(1, None, "H100")
    assert cost.fp8_peak(h100, "rowwise", 8192, 0.5) == pytest.approx(1979e12 * cost.ACHIEVABLE * 0.5)


def test_fp8_cast_bytes_by_hand():
    stats = ModelStats.from_config(CONFIG)
    workload = Workload(seq_len=2048, global_batch_size=4, fp8="rowwise")
    plan = _plan(workload)
    # inputs 6h + f = 20480, output gradients 3h + 2kv + 2f = 23552: 44032 elements per token and block;
    # eager: 2a + 12 = 16 bytes each; 2 blocks, 1000 tokens
    assert cost.fp8_cast_bytes(stats, plan, 1000, 2, workload) == 44032 * 16 * 2 * 1000
    compiled = replace(workload, compile=True)  # a + 12 = 14
    assert cost.fp8_cast_bytes(stats, plan, 1000, 2, compiled) == 44032 * 14 * 2 * 1000
    assert cost.fp8_cast_bytes(stats, plan, 1000, 2, replace(workload, fp8="none")) == 0


def test_compiled_memory_bound_bytes_by_hand():
    stats = ModelStats.from_config(CONFIG)
    plan = _plan(Workload(seq_len=2048, global_batch_size=4))
    eager = cost.memory_bound_bytes(stats, plan, 1000, 2)
    compiled = cost.memory_bound_bytes(stats, plan, 1000, 2, compiled=True)
    blocks = 3 * cost.elementwise_forward_bytes(stats, plan, 2) * 2 * 1000
    # what compile changes: a third of the blocks' bytes, 8 bytes per logit instead of 40
    assert eager - compiled == pytest.approx(blocks * 2 / 3 + (40 - 8) * 128256 * 1000)


def test_compiled_activations_are_70_percent_of_the_blocks_and_4_bytes_per_logit():
    stats = ModelStats.from_config(CONFIG)
    eager_w = Workload(seq_len=2048, global_batch_size=4)
    plan = _plan(eager_w)
    eager = estimate_memory(stats, plan, eager_w)
    compiled = estimate_memory(stats, plan, replace(eager_w, compile=True))
    blocks, logits = activation_bytes(stats, plan, 2048, 2), logits_bytes(stats, plan, 2048, 2)
    assert eager.activations_bytes == blocks + logits
    assert compiled.activations_bytes == int(0.7 * blocks) + logits * 4 // 12


def test_compile_and_fp8_in_the_step_time():
    stats = ModelStats.from_config(CONFIG)
    h100 = make_cluster(1, None, "H100")
    base = Workload(seq_len=2048, global_batch_size=4)
    plan = _plan(base)
    eager = cost.estimate_time(stats, plan, h100, base)
    compiled = cost.estimate_time(stats, plan, h100, replace(base, compile=True))
    fp8 = cost.estimate_time(stats, plan, h100, replace(base, compile=True, fp8="rowwise"))
    # datasheet path: compile saves two thirds of the operator floor; FP8 moves the projections' FLOPs to the FP8 rate
    ops_saved = 2 * cost.OPS_PER_BLOCK * (2 / 3) * h100.gpu.op_overhead_s
    assert eager.compute_s - compiled.compute_s == pytest.approx(ops_saved)
    tokens = 4 * 2048
    linear = 3.0 * 2 * (stats.block_forward_flops(2048) - stats.attention_forward_flops(2048)) * tokens
    saturation = tokens / (tokens + cost.HALF_EFFICIENCY_TOKENS)
    bf16, f8 = 989e12 * 0.45 * saturation, 1979e12 * 0.45 * saturation
    assert compiled.compute_s - fp8.compute_s == pytest.approx(linear / bf16 - linear / f8)
    # on a GPU without FP8 the rate stays bf16's: nothing gained
    a100 = make_cluster(1, None, "A100")
    assert cost.estimate_time(stats, plan, a100, replace(base, fp8="rowwise")).compute_s == pytest.approx(
        cost.estimate_time(stats, plan, a100, base).compute_s
    )


PROFILE = "bench/results/h100_probe.json"  # bigtrain probe on an H100, with its FP8 matmuls


def _speed_choices(gpu: str, config: dict, gpus: int, seq_len: int, batch: int):
    from pathlib import Path

    from bigtrain.planner.profile import gpu_from_profile, load_profile
    from bigtrain.planner.search import search

    cluster = make_cluster(gpus, None, gpu)
    profile = load_profile(Path(__file__).resolve().parents[2] / PROFILE)
    cluster = replace(cluster, gpu=gpu_from_profile(profile, cluster.gpu))
    workload = Workload(seq_len=seq_len, global_batch_size=batch, compile="auto", fp8="auto")
    candidates = search(ModelStats.from_config(config), cluster, workload)
    return candidates[0], {(c.compile, c.fp8) for c in candidates}


def test_auto_offers_compile_and_fp8_on_an_h100_profile_where_they_win():
    # Llama-3-8B's width at 4 layers, 8 x 2048 tokens on one H100: compile and tensorwise FP8 predicted fastest
    wide = dict(CONFIG, hidden_size=4096, intermediate_size=14336, num_hidden_layers=4)
    best, offered = _speed_choices("H100", wide, 1, 2048, 8)
    assert offered == {(c, f) for c in (False, True) for f in ("none", "tensorwise", "rowwise")}
    assert (best.compile, best.fp8) == (True, "tensorwise")
    # Llama-3.2-1B's width: FP8 is no faster there (as measured), so the simpler bf16 compile is chosen
    best, _ = _speed_choices("H100", dict(CONFIG, num_hidden_layers=16), 1, 2048, 8)
    assert (best.compile, best.fp8) == (True, "none")


def test_auto_never_offers_fp8_on_a_gpu_without_it():
    wide = dict(CONFIG, hidden_size=4096, intermediate_size=14336, num_hidden_layers=4)
    _, offered = _speed_choices("A100", wide, 1, 2048, 8)  # the H100's measured rates on an A100's table entry
    assert {fp8 for _, fp8 in offered} == {"none"}
