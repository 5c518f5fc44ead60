"""The planner with a preference objective: a pair is two rows, the reference is a plan dimension it weighs (memory
against the forward each live reference adds), and the table says what it chose and what each other would cost."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import make_plan

import bigtrain
from bigtrain.config.capabilities.reference import REFERENCE
from bigtrain.config.workload import Workload
from bigtrain.job import job_facts
from bigtrain.planner.cost import estimate_time
from bigtrain.planner.hardware import make_cluster
from bigtrain.planner.memory import estimate_memory
from bigtrain.planner.model_stats import ModelStats, load_model_config

STATS = ModelStats.from_config(load_model_config("llama-3-8b"))
CLUSTER = make_cluster(8, None, "H100", "80GB")


def _dpo(reference: str, **plan) -> tuple:
    p = make_plan(**{"dp_shard": 8, "micro_batch_size": 1, **plan}).with_option(REFERENCE.name, reference)
    return p, Workload(seq_len=2048, global_batch_size=64, job=job_facts("dpo"))


def test_a_pair_is_two_rows_and_the_sharded_copy_adds_its_shard():
    plan, dpo = _dpo("precomputed")
    sft = dataclasses.replace(dpo, job=job_facts("sft"), global_batch_size=128)
    assert (
        estimate_memory(STATS, plan, dpo).total_bytes
        == estimate_memory(STATS, plan.but(micro_batch_size=2), sft).total_bytes
    )
    sharded = estimate_memory(STATS, plan.with_option(REFERENCE.name, "sharded"), dpo).total_bytes
    assert sharded - estimate_memory(STATS, plan, dpo).total_bytes == STATS.params * 2 // 8


def test_a_live_reference_adds_a_forward_and_precomputed_shares_it_over_the_epochs():
    plan, dpo = _dpo("sharded")
    sft = dataclasses.replace(dpo, job=job_facts("sft"), global_batch_size=128)
    rows = estimate_time(STATS, plan.but(micro_batch_size=2), CLUSTER, sft)
    live = estimate_time(STATS, plan, CLUSTER, dpo)
    assert live.step_s == pytest.approx(rows.step_s + rows.compute_s / 3)
    once = estimate_time(STATS, plan.with_option(REFERENCE.name, "precomputed"), CLUSTER, dpo)
    thrice = estimate_time(STATS, plan.with_option(REFERENCE.name, "precomputed"), CLUSTER,
                           dataclasses.replace(dpo, epochs=3))  # fmt: skip
    assert once.step_s == pytest.approx(live.step_s)
    assert thrice.step_s == pytest.approx(rows.step_s + rows.compute_s / 9)
    offloaded = estimate_time(STATS, plan.with_option(REFERENCE.name, "offloaded"), CLUSTER, dpo)
    assert offloaded.step_s > live.step_s  # its shard crosses PCIe before each micro-batch's forward


# Llama-3-8B's published parameter count (meta-llama/Meta-Llama-3-8B, the safetensors' total), typed by hand
LLAMA_3_8B_PARAMS = 8_030_261_248


def test_dpo_on_8_h100_keeps_a_sharded_frozen_copy_because_it_costs_2_gb_and_no_time():
    """By hand: a full fine-tune has no adapters to switch off, so the reference is a frozen copy (sharded or
    offloaded) or precomputed. The copy is 8,030,261,248 x 2 bytes (bf16) / 8 FSDP2 shards = 2,007,565,312 bytes
    per GPU, which the chosen plan affords. With one epoch, precomputing runs the same forward once per pair, as the
    live copy does: no time saved, and it is a pass before step 1 plus a file, so the simpler sharded copy wins.
    Offloading pays that shard over PCIe Gen5 (64 GB/s) before each micro-batch's forward: 256 pairs / 8 ranks /
    1 pair per micro-batch = 32 copies = 32 x 2,007,565,312 / 64e9 = 1.0038 s more per step."""
    result = bigtrain.plan("llama-3-8b", gpus=8, gpu="H100", objective="dpo")
    assert result.fits and result.method == "full"
    assert REFERENCE.of(result.plan) == "sharded"
    plain = result.plan.with_option(REFERENCE.name, "auto")
    same = {  # the chosen layout with each reference the search weighed
        REFERENCE.of(c.plan): c
        for c in result.searched
        if c.method == result.method and c.plan.with_option(REFERENCE.name, "auto") == plain
    }
    assert set(same) == {"sharded", "offloaded", "precomputed"}
    shard = LLAMA_3_8B_PARAMS * 2 // 8
    assert shard == 2_007_565_312
    assert same["sharded"].memory.total_bytes - same["precomputed"].memory.total_bytes == shard
    assert same["sharded"].fits and same["sharded"].memory.budget_bytes <= int(79.1 * 2**30)
    assert same["precomputed"].time.step_s == pytest.approx(same["sharded"].time.step_s, rel=1e-9)
    assert same["offloaded"].time.step_s - same["sharded"].time.step_s == pytest.approx(32 * shard / 64e9, rel=1e-6)
    text = result.explain()
    assert "global batch 256 pairs (512 rows)" in text and "reference model: sharded:" in text
    # three passes over the pairs: precomputing pays its forward once for three epochs, the live copy every epoch
    assert REFERENCE.of(bigtrain.plan("llama-3-8b", gpus=8, gpu="H100", objective="dpo", epochs=3).plan) == "precomputed"


def test_dpo_on_one_4090_with_method_auto_fits_with_the_adapter_disabled_base_or_precomputed():
    result = bigtrain.plan("llama-3-8b", gpus=1, gpu="RTX4090", objective="dpo", method="auto")
    assert result.fits and result.method in ("lora", "qlora")
    assert REFERENCE.of(result.plan) == "adapter_disabled"  # one pass over the data: precomputed saves nothing
    several = bigtrain.plan("llama-3-8b", gpus=1, gpu="RTX4090", objective="dpo", method="auto", epochs=3)
    assert REFERENCE.of(several.plan) == "precomputed"
    assert "with adapter_disabled: " in several.explain()


def test_reference_free_objectives_weigh_no_reference():
    result = bigtrain.plan("llama-3-8b", gpus=8, gpu="H100", objective="simpo")
    assert REFERENCE.of(result.plan) == "auto" and "reference model" not in result.explain()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(objective="kto"), "objective='kto' is not an objective; use auto, sft, classification, dpo, ipo"),
        (dict(objective="dpo", epochs=0), "epochs=0 must be above 0"),
    ],
)
def test_bad_planner_input(kwargs, message):
    with pytest.raises(bigtrain.ConfigError, match=message):
        bigtrain.plan("llama-3-8b", gpus=8, gpu="H100", **kwargs)


def test_the_docs_plan_commands_give_fitting_plans_with_a_reference(cli_in_process):
    """docs/preference.md's two bigtrain plan commands, as written."""
    from helpers import docs_commands

    first, second = docs_commands("preference-plan")
    eight = cli_in_process(first.split()[1:])
    assert eight.returncode == 0, eight.stderr
    assert "* fsdp2 zero2 dp=8 tp=1 pp=1 ac=none mb=1 rs=micro reference=sharded" in eight.stdout
    assert "reference model: sharded: a frozen copy" in eight.stdout and "  with precomputed: " in eight.stdout
    one = cli_in_process(second.split()[1:])
    assert one.returncode == 0, one.stderr
    assert "* qlora ddp dp=1" in one.stdout and "reference=adapter_disabled" in one.stdout
    assert "reference model: adapter_disabled: the adapters switched off" in one.stdout
