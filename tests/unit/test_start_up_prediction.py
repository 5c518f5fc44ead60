"""The start-up plan line's prediction (``planner.auto.predict``): its peak per device always, its step time on GPUs
(the time model has no numbers for CPU processes, so a CPU run says none rather than a wrong one). The peak is
checked against a hand count where the model's states are the peak, not against the estimate that makes it."""

from __future__ import annotations

import re

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.auto import local_cluster, predict
from bigtrain.planner.hardware import GiB
from bigtrain.planner.model_stats import load_model_config
from bigtrain.planner.planned import lm_model

PLAN = Plan(
    backend="fsdp2", zero_stage=3, grad_reduce="every_micro_step", dp_replicate=1, dp_shard=8, tp=1, pp=1,
    pp_schedule="1f1b", activation_checkpointing="full", micro_batch_size=1, offload_optimizer=False,
    offload_params=False,
)  # fmt: skip
WORKLOAD = Workload(seq_len=4096, global_batch_size=64)
LLAMA_3_8B_PARAMS = 8_030_261_248  # published (meta-llama/Meta-Llama-3-8B), typed by hand
LLAMA = lm_model(load_model_config("llama-3-8b"))


def test_on_gpus_the_line_gives_the_planner_s_peak_and_step_time():
    words = predict(LLAMA, PLAN, local_cluster(8, 8, "NVIDIA H100 80GB HBM3", 79 * GiB), WORKLOAD)
    found = re.fullmatch(r"predicted peak ([\d.]+) GiB per device, ([\d.]+) s per step", words)
    assert found, words
    # FSDP2 over 8 ranks shards the model's states: at least 16 / 8 bytes a parameter (14.96 GiB) is the floor
    assert float(found[1]) > 16 * LLAMA_3_8B_PARAMS / 8 / GiB and float(found[2]) > 0


def test_on_cpu_processes_the_line_gives_the_peak_only():
    words = predict(LLAMA, PLAN, local_cluster(8, 8, None, 64 * GiB), WORKLOAD)
    assert re.fullmatch(r"predicted peak [\d.]+ GiB per device", words), words


def test_the_line_s_peak_is_the_hand_counted_model_states_where_they_are_the_peak():
    """DDP on one model replica, 128-token rows, full checkpointing: activations are a few MiB against 32 GB of
    gradients, so the peak is the optimizer step, counted by hand per parameter: fp32 weights 4 + fp32 gradients 4 +
    AdamW's m and v 8 (ZeRO's 16 bytes of mixed-precision Adam) + foreach AdamW's state-sized sqrt(v) temporary 4 =
    20 bytes x 8,030,261,248 = 160,605,224,960 bytes = 149.58 GiB."""
    ddp = PLAN.but(backend="ddp", zero_stage=0, grad_reduce="once_per_step", dp_replicate=8, dp_shard=1)
    short = Workload(seq_len=128, global_batch_size=8)
    words = predict(LLAMA, ddp, local_cluster(8, 8, None, 64 * GiB), short)
    assert 20 * LLAMA_3_8B_PARAMS == 160_605_224_960
    assert words == "predicted peak 149.58 GiB per device"


def test_a_small_run_s_peak_reads_in_mib_not_zero_gib():
    tiny = lm_model({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})  # fmt: skip
    one = PLAN.but(dp_shard=1, activation_checkpointing="none")
    words = predict(tiny, one, local_cluster(1, 1, None, 64 * GiB), Workload(seq_len=128, global_batch_size=4))
    found = re.fullmatch(r"predicted peak ([\d.]+) MiB per device", words)
    assert found and 0.5 < float(found[1]) < 1024, words
