"""The step-time model (planner/cost.py) against hand-computed numbers: FLOPs per token, the collective volume of
each backend, the pipeline bubble, offload, and the near-tie rule of the ranking. A GPU with round measured rates
and links makes every number checkable by hand."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import ParallelConfig, TrainConfig
from bigtrain.config.workload import Workload
from bigtrain.planner.cost import CPU_ADAM_PARAMS_PER_S, estimate_time, model_flops_per_token
from bigtrain.planner.hardware import GPU, Cluster
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.planner.ranking import NEAR_TIE
from bigtrain.planner.ranking import rank as _rank

GPT2 = ModelStats.from_config(load_model_config("gpt2"))
PSI = 124_439_808  # GPT-2's parameters (tied head), the model card's 124M
INSTANT = 1e12  # TFLOP/s: compute vanishes next to communication
# 1 GB/s within a node, 0.5 between nodes, 2 GB/s to the host
# no per-operator launch floor either (tested on its own below)
LINKS = GPU("test", 2**40, 100.0, 1.0, 0.5, 2.0, measured_tflops=(("bf16", 1024, INSTANT),), op_overhead_s=0.0)


def plan(world: int, batch: int, **parallel):
    return resolve_plan(ParallelConfig(**parallel), world, TrainConfig(global_batch_size=batch))


def step(p, gpus: int = 4, per_node: int = 4, batch: int = 4, gpu: GPU = LINKS) -> float:
    return estimate_time(GPT2, p, Cluster(gpu, gpus, per_node), Workload(seq_len=1024, global_batch_size=batch, mixed_precision="bf16")).step_s


def test_flops_per_token_is_6n_plus_attention():
    assert GPT2.params == PSI
    # 6 x (12 blocks x 7,087,872 + the 50257 x 768 head) + 12 x 12 layers x 1024 tokens x 768
    assert model_flops_per_token(GPT2, 1024) == 6 * (12 * 7_087_872 + 50257 * 768) + 12 * 12 * 1024 * 768


def test_compute_time_is_flops_over_the_rate_and_full_checkpointing_adds_the_blocks_forward():
    gpu = replace(LINKS, measured_tflops=(("bf16", 1024, 1.0),), intra_node_gbps=1e12)
    p = plan(1, 1, backend="ddp", micro_batch_size=1)
    t = estimate_time(GPT2, p, Cluster(gpu, 1, 1), Workload(seq_len=1024, global_batch_size=1, mixed_precision="bf16"))
    assert t.compute_s == pytest.approx(model_flops_per_token(GPT2, 1024) * 1024 / 1e12)
    full = plan(1, 1, backend="ddp", micro_batch_size=1, activation_checkpointing="full")
    # the blocks' forward again (2 per block parameter and token, and attention's 4 x layers x L x d), not the head's
    blocks_forward = 2 * 12 * 7_087_872 + 4 * 12 * 1024 * 768
    assert estimate_time(GPT2, full, Cluster(gpu, 1, 1), Workload(seq_len=1024, global_batch_size=1, mixed_precision="bf16")).compute_s == pytest.approx(
        t.compute_s + blocks_forward * 1024 / 1e12
    )
    # every other block checkpointed: half of that
    half = plan(1, 1, backend="ddp", micro_batch_size=1, activation_checkpointing="full", checkpoint_every=2)
    assert estimate_time(GPT2, half, Cluster(gpu, 1, 1), Workload(seq_len=1024, global_batch_size=1, mixed_precision="bf16")).compute_s == pytest.approx(
        t.compute_s + blocks_forward / 2 * 1024 / 1e12
    )


def test_ddp_all_reduces_fp32_gradients_once_per_step():
    # ring all-reduce: 2 (n-1)/n of 4 bytes per parameter
    assert step(plan(4, 8, backend="ddp", micro_batch_size=1)) == pytest.approx(2 * 0.75 * 4 * PSI / 1e9, rel=1e-6)


@pytest.mark.parametrize("reduce, reductions", [("every_micro_step", 2), ("once_per_step", 1)])
def test_fsdp2_gathers_per_micro_step_and_reduce_scatters_as_its_mode_says(reduce, reductions):
    # ZeRO-3: bf16 all-gather in forward and in backward of each of 2 micro-steps, fp32 reduce-scatters
    p = plan(4, 8, backend="fsdp2", zero_stage=3, micro_batch_size=1, grad_reduce=reduce)
    volume = 2 * 2 * 2 * PSI + reductions * 4 * PSI
    assert step(p, batch=8) == pytest.approx(0.75 * volume / 1e9, rel=1e-6)
    zero2 = plan(4, 8, backend="fsdp2", zero_stage=2, micro_batch_size=1, grad_reduce=reduce)
    assert step(zero2, batch=8) == pytest.approx(0.75 * (2 * 2 * PSI + reductions * 4 * PSI) / 1e9, rel=1e-6)


def test_a_group_across_nodes_runs_at_the_network_bandwidth():
    inside = plan(4, 4, backend="fsdp2", zero_stage=3, micro_batch_size=1)
    across = plan(8, 8, backend="fsdp2", zero_stage=3, micro_batch_size=1)
    volume = 2 * 2 * PSI + 4 * PSI
    assert step(inside) == pytest.approx(0.75 * volume / 1e9, rel=1e-6)
    assert step(across, gpus=8, per_node=4, batch=8) == pytest.approx(0.875 * volume / 0.5e9, rel=1e-6)


@pytest.mark.parametrize("stage, copies", [(1, 2), (2, 2), (3, 3)])
def test_deepspeed_moves_two_or_three_compute_dtype_copies(stage, copies):
    p = plan(4, 4, backend="deepspeed", zero_stage=stage, micro_batch_size=1)
    assert step(p) == pytest.approx(0.75 * copies * 2 * PSI / 1e9, rel=1e-6)


def test_optimizer_offload_adds_the_pcie_copies_and_the_host_step():
    base = plan(4, 4, backend="deepspeed", zero_stage=2, micro_batch_size=1)
    offloaded = plan(4, 4, backend="deepspeed", zero_stage=2, micro_batch_size=1, offload_optimizer=True)
    # bf16 gradients down and parameters up (2 x 2 bytes of the rank's quarter) at 2 GB/s, AdamW on the host
    extra = 2 * 2 * PSI / 4 / 2e9 + PSI / 4 / CPU_ADAM_PARAMS_PER_S
    assert step(offloaded) - step(base) == pytest.approx(extra, rel=1e-6)


@pytest.mark.parametrize("schedule, virtual", [("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2)])
def test_pipeline_bubble(schedule, virtual):
    # m = 4 micro-batches over p = 2 stages: (v m + p - 1) / (v m) of the stage's compute
    gpu = replace(LINKS, measured_tflops=(("bf16", 1024, 1.0),), intra_node_gbps=1e12)
    flat = plan(2, 8, backend="fsdp2", dp_shard=1, dp_replicate=2, micro_batch_size=1)
    piped = plan(2, 4, backend="fsdp2", pp=2, pp_schedule=schedule, pp_virtual_stages=virtual, micro_batch_size=1)
    t_flat = estimate_time(GPT2, flat, Cluster(gpu, 2, 2), Workload(seq_len=1024, global_batch_size=8, mixed_precision="bf16")).compute_s
    t_pipe = estimate_time(GPT2, piped, Cluster(gpu, 2, 2), Workload(seq_len=1024, global_batch_size=4, mixed_precision="bf16")).compute_s
    # the pp plan runs half the tokens (4 sequences, all on one pipeline) over the same 2 ranks
    assert t_pipe == pytest.approx(t_flat / 2 * (virtual * 4 + 1) / (virtual * 4))


def _candidate(step_s: float, complexity_backend: str, fits: bool = True):
    p = plan(2, 2, backend=complexity_backend, micro_batch_size=1)
    return SimpleNamespace(plan=p, fits=fits, time=SimpleNamespace(step_s=step_s), memory=None, rejected_because=None,
                           compile=False, fp8="none")


def test_near_tie_goes_to_the_simpler_plan_and_a_real_gap_does_not():
    fast_complex = _candidate(1.0, "deepspeed")
    simple_within = _candidate(1.0 + NEAR_TIE / 2, "ddp")
    assert _rank([fast_complex, simple_within])[0] is simple_within
    simple_beyond = _candidate(1.0 + NEAR_TIE * 2, "ddp")
    assert _rank([fast_complex, simple_beyond])[0] is fast_complex


def test_with_a_measured_memory_bandwidth_element_wise_work_loss_and_adamw_are_timed_by_it():
    # 1 TFLOP/s and 1 GB/s: the memory-bound bytes (counted by hand below) add seconds one per GB
    gpu = replace(LINKS, measured_tflops=(("bf16", 1024, 1.0),), intra_node_gbps=1e12, copy_gbps=1.0)
    p = plan(1, 1, backend="ddp", micro_batch_size=1)
    matmuls = model_flops_per_token(GPT2, 1024) * 1024 / 1e12
    h, f, a = 768, 3072, 2
    elementwise = 3 * (61 * a * h + 5 * a * f) * 12 * 1024  # forward + backward, 12 blocks, 1024 tokens
    loss = 40 * 50257 * 1024
    adamw = 28 * PSI
    t = estimate_time(GPT2, p, Cluster(gpu, 1, 1), Workload(seq_len=1024, global_batch_size=1, mixed_precision="bf16"))
    assert t.compute_s == pytest.approx(matmuls + (elementwise + loss + adamw) / 1e9)
    # full checkpointing repeats the blocks' forward (not the head's) and its element-wise work; selective only the
    # element-wise work; FSDP2 steps AdamW on its shard only
    cluster, work = Cluster(gpu, 1, 1), Workload(seq_len=1024, global_batch_size=1, mixed_precision="bf16")
    full = estimate_time(GPT2, plan(1, 1, backend="ddp", micro_batch_size=1, activation_checkpointing="full"), cluster, work)
    blocks_forward = (2 * 12 * 7_087_872 + 4 * 12 * 1024 * 768) * 1024 / 1e12
    assert full.compute_s - t.compute_s == pytest.approx(blocks_forward + elementwise / 3 / 1e9)
    selective = plan(1, 1, backend="ddp", micro_batch_size=1, activation_checkpointing="selective")
    assert estimate_time(GPT2, selective, cluster, work).compute_s - t.compute_s == pytest.approx(elementwise / 3 / 1e9)
    sharded = plan(4, 4, backend="fsdp2", zero_stage=3, micro_batch_size=1)
    s = estimate_time(GPT2, sharded, Cluster(replace(gpu, intra_node_gbps=1e12), 4, 4), Workload(seq_len=1024, global_batch_size=4, mixed_precision="bf16"))
    assert s.compute_s == pytest.approx(matmuls + (elementwise + loss + adamw / 4) / 1e9, rel=1e-6)


def test_a_cpu_profile_hides_no_communication():
    # gloo runs on the cores that compute: DDP's all-reduce adds in full even when compute could have covered it
    slow = replace(LINKS, measured_tflops=(("bf16", 1024, 1e-3),))
    p = plan(4, 8, backend="ddp", micro_batch_size=1)
    overlapped = estimate_time(GPT2, p, Cluster(slow, 4, 4), Workload(seq_len=1024, global_batch_size=8, mixed_precision="bf16"))
    serial = estimate_time(GPT2, p, Cluster(replace(slow, overlaps_comm=False), 4, 4), Workload(seq_len=1024, global_batch_size=8, mixed_precision="bf16"))
    all_reduce = 2 * 0.75 * 4 * PSI / 1e9
    assert overlapped.compute_s > all_reduce and overlapped.comm_s == pytest.approx(0.1 * all_reduce)
    assert serial.comm_s == pytest.approx(all_reduce)


def test_a_tiny_model_is_not_predicted_at_microseconds_per_step():
    # 60 operators per block and micro-step at 5 us each: GPT-2's 12 blocks x 4 micro-steps = 14.4 ms at least
    gpu = replace(LINKS, op_overhead_s=5e-6, intra_node_gbps=1e12)
    p = plan(1, 4, backend="ddp", micro_batch_size=1)
    assert estimate_time(GPT2, p, Cluster(gpu, 1, 1), Workload(seq_len=8, global_batch_size=4, mixed_precision="bf16")).step_s == pytest.approx(
        4 * 12 * 60 * 5e-6, rel=1e-3
    )
