"""The planner's adapter terms (``planner/adapter_memory.py``, ``cost.py``) against hand-computed numbers and peft's
own modules, and ``train.method: auto``'s choice on the issue's three setups."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from cases import TINY_LLAMA
from helpers import make_plan

from bigtrain.config.hf import hf_config_from_dict
from bigtrain.config.schema import AdapterConfig
from bigtrain.config.workload import Workload
from bigtrain.models.build import build_meta_model
from bigtrain.planner.adapter_memory import (
    NF4_BYTES,
    adapter_flops_per_token,
    adapter_params,
    dequant_bytes,
    estimate_adapter_memory,
    trained_params,
)
from bigtrain.planner.cost import MEMORY_ACHIEVABLE, estimate_time, model_flops_per_token
from bigtrain.planner.hardware import make_cluster
from bigtrain.planner.model_stats import ModelStats, load_model_config

GPT2 = dict(model_type="gpt2", vocab_size=128, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
QWEN2 = {**TINY_LLAMA, "model_type": "qwen2", "tie_word_embeddings": False}


@pytest.mark.parametrize("config", [TINY_LLAMA, GPT2, QWEN2], ids=["llama", "gpt2", "qwen2"])
def test_adapter_parameters_are_what_peft_injects(config):
    from peft import inject_adapter_in_model

    from bigtrain.parallel.transforms.adapters import peft_config, target_modules

    model = build_meta_model(hf_config_from_dict(config), "sdpa")
    lora = AdapterConfig(r=8)
    inject_adapter_in_model(peft_config(lora, target_modules(model, lora)), model)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trained == adapter_params(ModelStats.from_config(load_model_config(config)), 8)


@pytest.mark.parametrize(
    ("config", "modules"),
    [
        (TINY_LLAMA, ("embed_tokens",)),  # tied: the LM head is the same weight
        (TINY_LLAMA, ("lm_head", "norm")),  # every norm, in and outside the blocks (peft's suffix rule)
        (QWEN2, ("embed_tokens", "lm_head")),
        (GPT2, ("wte", "ln_f", "ln_1")),
    ],
    ids=["llama-tied-embed", "llama-head-norms", "qwen2-untied", "gpt2"],
)
def test_modules_trained_fully_are_counted_as_the_trainer_unfreezes_them(config, modules):
    from bigtrain.parallel.transforms.adapters import inject_adapters

    model = build_meta_model(hf_config_from_dict(config), "sdpa")
    lora = AdapterConfig(r=8, modules_to_save=list(modules))
    inject_adapters(model, lora)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    stats = ModelStats.from_config(load_model_config(config))
    workload = Workload(seq_len=64, global_batch_size=2, method="lora", lora_rank=8, modules_to_save=modules)
    assert trained == trained_params(stats, workload) > adapter_params(stats, 8)


def test_model_states_of_an_adapter_plan_by_hand():
    stats = ModelStats.from_config(load_model_config("llama-3-8b"))
    plan = make_plan(dp_shard=4, zero_stage=3, micro_batch_size=1)
    lora = Workload(seq_len=1024, global_batch_size=4, mixed_precision="bf16", method="lora", lora_rank=16)
    psi_a = 16 * (7 * 4096 + 2 * 4096 + 2 * 1024 + 3 * 14336) * 32  # r (7h + 2 q + 2 kv + 3 ffn) per block
    assert adapter_params(stats, 16) == psi_a
    blocks, root = 32 * stats.block_params, stats.root_params
    m = estimate_adapter_memory(stats, plan, lora)
    assert m.params_bytes == int((2 * blocks + 2 * root) / 4 + 4 * psi_a / 4)  # bf16 base, fp32 adapters: / S
    assert m.optimizer_bytes == int(8 * psi_a / 4)  # AdamW's m and v, adapters only
    q = estimate_adapter_memory(stats, plan, replace(lora, method="qlora"))
    assert q.params_bytes == int((NF4_BYTES * blocks + 2 * root) / 4 + 4 * psi_a / 4)  # NF4 blocks, bf16 root
    assert NF4_BYTES == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256))


def test_adapter_time_terms_by_hand():
    stats = ModelStats.from_config(load_model_config("llama-3-8b"))
    matmul = 32 * stats.block_params + stats.vocab * stats.hidden
    attention = 12 * 32 * 2048 * stats.q_width
    psi_a = adapter_params(stats, 16)
    workload = Workload(seq_len=2048, global_batch_size=8, mixed_precision="bf16", method="lora")
    assert adapter_flops_per_token(stats, 2048, workload) == 4 * matmul + 6 * psi_a + attention
    # the LM head trained fully (peft's modules_to_save): its weight gradient, 2 per parameter and token
    head = replace(workload, modules_to_save=("lm_head",))
    assert adapter_flops_per_token(stats, 2048, head) == 4 * matmul + 6 * psi_a + 2 * 128256 * 4096 + attention
    assert model_flops_per_token(stats, 2048) == 6 * matmul + attention  # full fine-tuning: 6N
    plan = make_plan(dp_shard=8, micro_batch_size=1)
    qlora = Workload(seq_len=2048, global_batch_size=8, mixed_precision="bf16", method="qlora")
    # forward and backward each read every NF4 weight (0.516 B) and write it in bf16 (2 B)
    assert dequant_bytes(stats, plan, qlora) == pytest.approx(2 * 32 * stats.block_params * (NF4_BYTES + 2))
    full_ac = replace(plan, activation_checkpointing="full")
    assert dequant_bytes(stats, full_ac, qlora) == pytest.approx(1.5 * dequant_bytes(stats, plan, qlora))
    cluster = make_cluster(8, 8, "H100", "80GB")
    lora = replace(qlora, method="lora")
    gap = estimate_time(stats, plan, cluster, qlora).compute_s - estimate_time(stats, plan, cluster, lora).compute_s
    assert gap == pytest.approx(dequant_bytes(stats, plan, qlora) / (3350e9 * MEMORY_ACHIEVABLE))


def plan_json(cli, *args):
    proc = cli(["plan", *args, "--method", "auto", "--json"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_auto_offers_qlora_for_70b_on_two_24_gb_gpus(cli_in_process):
    out = plan_json(cli_in_process, "--model", "llama-3-70b", "--gpus", "2", "--gpu", "RTX4090")
    assert out["fits"] and out["method"] == "qlora"
    # no plan fits 2 x 24 GB without offload: FSDP2 keeps the 4-bit base's shards in host memory
    assert out["plan"]["backend"] == "fsdp2" and out["plan"]["offload_params"]


def test_auto_fits_8b_on_one_24_gb_gpu_without_offload(cli_in_process):
    out = plan_json(cli_in_process, "--model", "llama-3-8b", "--gpus", "1", "--gpu", "RTX4090")
    assert out["fits"] and out["method"] in ("lora", "qlora")
    assert not (out["plan"]["offload_params"] or out["plan"]["offload_optimizer"])


def test_auto_keeps_full_fine_tuning_for_8b_on_eight_h100(cli_in_process):
    out = plan_json(cli_in_process, "--model", "llama-3-8b", "--gpus", "8", "--gpu", "H100")
    assert out["fits"] and out["method"] == "full"


def test_the_table_says_what_the_adapters_train_and_why_not_full(cli_in_process):
    proc = cli_in_process(["plan", "--model", "llama-3-8b", "--gpus", "1", "--gpu", "RTX4090", "--method", "auto"])
    assert "adapters of rank 16 train 41.9 M parameters" in proc.stdout
    assert "full fine-tuning fits only with offload (best: deepspeed" in proc.stdout
