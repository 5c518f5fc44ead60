"""The start-up plan line's prediction (``planner.auto.predict``): its peak per device always, its step time on GPUs
(the time model has no numbers for CPU processes, so a CPU run says none rather than a wrong one)."""

from __future__ import annotations

import re

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.auto import local_cluster, predict
from bigtrain.planner.hardware import GiB
from bigtrain.planner.memory import estimate_memory
from bigtrain.planner.model_stats import ModelStats, load_model_config

PLAN = Plan(
    backend="fsdp2", zero_stage=3, grad_reduce="every_micro_step", dp_replicate=1, dp_shard=8, tp=1, pp=1,
    pp_schedule="1f1b", activation_checkpointing="full", micro_batch_size=1, offload_optimizer=False,
    offload_params=False,
)  # fmt: skip
WORKLOAD = Workload(seq_len=4096, global_batch_size=64)


def test_on_gpus_the_line_gives_the_planner_s_peak_and_step_time():
    config = load_model_config("llama-3-8b")
    words = predict(config, PLAN, local_cluster(8, 8, "NVIDIA H100 80GB HBM3", 79 * GiB), WORKLOAD)
    found = re.fullmatch(r"predicted peak ([\d.]+) GiB per device, ([\d.]+) s per step", words)
    assert found, words
    peak = estimate_memory(ModelStats.from_config(config), PLAN, WORKLOAD).total_bytes / GiB
    assert float(found[1]) == round(peak, 2) and float(found[2]) > 0


def test_on_cpu_processes_the_line_gives_the_peak_only():
    words = predict(load_model_config("llama-3-8b"), PLAN, local_cluster(8, 8, None, 64 * GiB), WORKLOAD)
    assert re.fullmatch(r"predicted peak [\d.]+ GiB per device", words), words
