"""grpo's rollouts in the planner: ``bigtrain plan --objective grpo`` (its arguments, their bad values), the time
terms' direction (what a sharded model's per-token gathers, longer completions and mu cost) and the table's words.
The memory terms are checked against the simulated step (tests/distributed/test_rollout_memory.py), the time terms
against a measured CPU run (``python bench/rollout_time.py``)."""

from __future__ import annotations

import dataclasses

import pytest

import bigtrain
from bigtrain.config.plan import Plan
from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import ParallelConfig, TrainConfig
from bigtrain.config.workload import Generation, Workload
from bigtrain.errors import ConfigError
from bigtrain.job import job_facts
from bigtrain.planner.hardware import make_cluster
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.planner.rollout_time import estimate_step_time, rollout_time

GRPO = dict(model="llama-3-8b", gpus=8, gpu="H100", objective="grpo")


def test_the_plan_generates_then_trains_and_says_both_phases():
    result = bigtrain.plan(**GRPO, rollout=dict(completion_length=1024, num_generations=8, prompt_length=256))
    w = result.workload
    assert w.generation == Generation(256, 1024, 8, 1) and w.seq_len == 1280
    assert w.global_batch_size % 8 == 0  # the default ~1M tokens rounded to whole groups
    assert "reference" not in w.job.roles  # TRL's beta 0: no KL term, no reference model
    phases = dict(result.time.phases)
    assert set(phases) == {"prefill", "decode", "logps", "train"} and phases["decode"] > phases["prefill"] > 0
    memory = dict(result.memory.phases)
    assert result.memory.total_bytes == max(memory.values())
    text = result.explain()
    assert "rollouts:" in text and "decode" in text and "peak: generation" in text


def test_a_kl_term_brings_the_reference_the_planner_places():
    result = bigtrain.plan(**GRPO, rollout=dict(completion_length=512, beta=0.04))
    assert "reference" in result.workload.job.roles
    assert "reference model:" in result.explain()


@pytest.mark.parametrize(
    "asked, words",
    [
        (dict(seq_len=2048), "seq_len=2048: a grpo row is its prompt and its completion"),
        (dict(rollout=dict(num_generations=1)), "num_generations=1 must be at least 2"),
        (
            dict(rollout=dict(num_generations=3), global_batch_size=64),
            "num_generations=3 does not divide global_batch_size=64",
        ),
        (dict(rollout=dict(completion_length=0)), "completion_length=0 must be at least 1"),
        (
            dict(objective="sft", rollout=dict(completion_length=64)),
            "completion_length is for objectives that generate",
        ),
    ],
)
def test_bad_rollout_arguments_are_one_line(asked, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        bigtrain.plan(**{**GRPO, **asked})


def _plan(backend: str, zero_stage: int = 0) -> Plan:
    parallel = ParallelConfig(backend=backend, zero_stage=zero_stage or None, micro_batch_size=1)
    return resolve_plan(parallel, 8, TrainConfig(global_batch_size=256))


def _time(plan: Plan, **generation) -> object:
    stats = ModelStats.from_config(load_model_config("llama-3-8b"))
    g = Generation(**{"prompt_len": 256, "completion_len": 512, "num_generations": 8, **generation})
    workload = Workload(seq_len=g.prompt_len + g.completion_len, global_batch_size=256, generation=g,
                        job=dataclasses.replace(job_facts("grpo"), roles=()))  # fmt: skip
    return stats, workload, make_cluster(8, gpu_name="H100")


def test_every_token_of_a_sharded_model_gathers_it_and_zero2_mode_once():
    zero3, zero2, ddp = _plan("fsdp2", 3), _plan("fsdp2", 2), _plan("ddp")
    stats, workload, cluster = _time(zero3)
    decode = {p.zero_stage if p.backend == "fsdp2" else 0: rollout_time(stats, p, cluster, workload, 1.0).decode_s
              for p in (zero3, zero2, ddp)}  # fmt: skip
    # an 8B model's bf16 bytes over NVLink per token (~31 ms) outweigh its compute at 32 rows (~11 ms)
    assert decode[3] > 2 * decode[2] and decode[2] == pytest.approx(decode[0], rel=0.01)


def test_longer_completions_and_more_iterations():
    plan = _plan("fsdp2", 2)
    stats, workload, cluster = _time(plan)
    short = rollout_time(stats, plan, cluster, workload, 1.0)
    _, longer, _ = _time(plan, completion_len=2048)
    assert rollout_time(stats, plan, cluster, longer, 1.0).decode_s > 4 * short.decode_s  # more steps, larger cache
    assert short.logps_s == 0  # mu = 1: the policy's own log-probabilities serve as the old ones
    _, twice, _ = _time(plan, num_iterations=2)
    once, shared = estimate_step_time(stats, plan, cluster, workload), estimate_step_time(stats, plan, cluster, twice)
    phases = dict(shared.phases)
    assert phases["logps"] > 0  # one forward for the generating policy's log-probabilities
    # each step carries half a generation (and half the logps pass)
    rollout = once.step_s - phases["train"]
    assert shared.step_s - phases["train"] == pytest.approx((rollout + phases["logps"]) / 2, rel=1e-6)


def test_the_probe_s_seconds_per_forward_are_the_host_s_share():
    """A profile's measured generate loop (bench/results/cpu_probe_rollout.json) replaces the operator floor."""
    import json
    from pathlib import Path

    from bigtrain.planner.auto import CPU
    from bigtrain.planner.hardware import Cluster
    from bigtrain.planner.profile import gpu_from_profile, load_profile
    from bigtrain.planner.rollout_time import host_seconds_per_forward

    path = Path(__file__).resolve().parents[2] / "bench" / "results" / "cpu_probe_rollout.json"
    measured = json.loads(path.read_text())["decode_step_s"]
    gpu = gpu_from_profile(load_profile(path), CPU)
    stats = ModelStats.from_config(load_model_config("llama-3-8b"))
    expected = measured["fixed"] + 32 * measured["per_block"]
    assert host_seconds_per_forward(stats, Cluster(gpu, 2, 2)) == pytest.approx(expected)
    assert host_seconds_per_forward(stats, Cluster(CPU, 2, 2)) == pytest.approx((150 + 40 * 32) * CPU.op_overhead_s)


@pytest.mark.full
def test_a_reward_model_folder_is_laid_out_as_the_policy_in_both_phases(tmp_path):
    """A reward-model folder among train.reward_functions adds its saved weights' bytes (read from the safetensors
    headers, nothing loaded) to both phases of the planned step, whole under DDP and ZeRO-2, half on each of 2 FSDP2
    or ZeRO-3 ranks, and the table says so."""
    import torch
    import yaml
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    from bigtrain.roles.rewards import reward_model_bytes

    config = LlamaConfig(vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0)  # fmt: skip
    model = AutoModelForSequenceClassification.from_config(config).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "rm")
    saved = sum(p.numel() * p.element_size() for p in model.parameters())
    assert reward_model_bytes([str(tmp_path / "rm"), "bigtrain.rewards:exact_answer"]) == saved

    def planned(rewards: list[str], backend: str = "ddp", **fix) -> object:
        recipe = {
            "model": {"config": {**config.to_dict(), "architectures": ["LlamaForCausalLM"], "num_labels": 2}},
            "data": {"path": "builtin:sums"},
            "train": {"objective": "grpo", "reward_functions": rewards, "global_batch_size": 16},
        }
        path = tmp_path / f"r{len(rewards)}.yaml"
        path.write_text(yaml.safe_dump(recipe))
        return bigtrain.plan(recipe=str(path), gpus=2, gpu="H100", fix={"backend": backend, **fix})

    alone = planned(["bigtrain.rewards:exact_answer"])
    judged = planned(["bigtrain.rewards:exact_answer", str(tmp_path / "rm")])
    for phase in ("generation", "training"):
        grown = dict(judged.memory.phases)[phase] - dict(alone.memory.phases)[phase]
        assert grown == saved, phase
    assert "reward models" in judged.explain() and "reward models" not in alone.explain()
    # laid out as the policy: FSDP2 shards it over its 2 ranks, DeepSpeed ZeRO-3 partitions it, ZeRO-2 keeps it whole
    for fix, share in (({"backend": "fsdp2"}, saved // 2), ({"backend": "deepspeed", "zero_stage": 3}, saved // 2),
                       ({"backend": "deepspeed", "zero_stage": 2}, saved)):  # fmt: skip
        with_model = dict(planned(["bigtrain.rewards:exact_answer", str(tmp_path / "rm")], **fix).memory.phases)
        without = dict(planned(["bigtrain.rewards:exact_answer"], **fix).memory.phases)
        assert with_model["training"] - without["training"] == share, fix


def test_the_json_contract_gains_the_phases_only_where_a_step_has_them():
    sft = bigtrain.plan(model="llama-3-8b", gpus=8, gpu="H100").to_dict()
    assert "phases" not in sft["memory"] and "phases" not in sft["time"]
    grpo = bigtrain.plan(**GRPO).to_dict()
    assert set(grpo["memory"]["phases"]) == {"generation", "training"}
    assert set(grpo["time"]["phases"]) == {"prefill", "decode", "logps", "train"}
