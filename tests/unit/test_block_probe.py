"""The planner's statistics measured on the model itself (``bigtrain/planner/block_probe.py``).

The formulas kept for Llama, Mistral and Qwen2 give the measured numbers byte for byte and FLOP for FLOP; the
measured families' parameter counts are the numel of the HF model; a mixture's active count and FLOPs follow its
router's top-k; what grows with the row (eager attention) is seen.
"""

from __future__ import annotations

import pytest
from cases import CONVERTED_FAMILIES, TINY_GEMMA2, TP_FAMILIES

from bigtrain.config.hf import config_object, hf_config_from_dict
from bigtrain.config.model_facts import ModelFacts
from bigtrain.planner.cost import model_flops_per_token
from bigtrain.planner.memory_terms import block_activation_bytes_per_token
from bigtrain.planner.model_stats import ModelStats, load_model_config

FORMULA_PRESETS = ("llama-3-8b", "mistral-7b", "qwen2.5-7b")


def measured(spec: str | dict) -> ModelStats:
    """The measured statistics of any model, formula families included (as if they had no formulas)."""
    cfg = load_model_config(spec)
    hf_config = config_object(cfg)
    return ModelStats.measured(cfg, hf_config, ModelFacts.of(hf_config))


@pytest.mark.parametrize("preset", FORMULA_PRESETS)
def test_the_formulas_are_the_measured_numbers(preset):
    formula, seen = ModelStats.from_config(load_model_config(preset)), measured(preset)
    assert seen.profile is not None and formula.profile is None
    for count in ("block_params", "attn_params", "mlp_params", "embed_params", "head_params", "norm_params", "params"):
        assert getattr(seen, count) == getattr(formula, count), count
    for a in (2, 4):
        for tp in (1, 2, 4):
            for sp in (False, True):
                want = block_activation_bytes_per_token(formula, a, tp, sp)
                got = block_activation_bytes_per_token(seen, a, tp, sp, seq_len=4096)
                # the formula floors each of its two norms' share under sequence parallelism, the measurement
                # divides their sum once: at most a byte apart
                assert abs(got - want) <= (1 if sp and tp > 1 else 0), (a, tp, sp)
    for seq_len in (1024, 8192):
        # the formula counts every block parameter as a matmul's (6 FLOPs per token in training), the FLOP counter
        # only the matmuls' weights: not the norms' weights (2h per block) nor Qwen2's q/k/v biases
        biases = formula.q_width + 2 * formula.kv_width if formula.qkv_bias else 0
        not_matmul = 6 * formula.layers * (2 * formula.hidden + biases)
        assert model_flops_per_token(seen, seq_len) == model_flops_per_token(formula, seq_len) - not_matmul


@pytest.mark.parametrize(
    "spec",
    [TINY_GEMMA2, *CONVERTED_FAMILIES.values(), *TP_FAMILIES.values()],
    ids=lambda s: s["model_type"],
)
def test_measured_counts_are_the_numel_of_the_hf_model(spec):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config_from_dict(spec))
    stats = measured(spec)
    assert stats.params == sum(p.numel() for p in model.parameters())


def test_a_mixture_counts_its_active_parameters_and_flops():
    """Mixtral-8x7B and Qwen3-30B-A3B: published 12.9B and 3.3B active of 46.7B and 30.5B."""
    mixtral, qwen = ModelStats.from_config(load_model_config("mixtral-8x7b")), measured("qwen3-30b-a3b")
    assert (mixtral.num_experts, mixtral.top_k, qwen.num_experts, qwen.top_k) == (8, 2, 128, 8)
    assert mixtral.active_params == pytest.approx(12.9e9, rel=0.005)
    assert qwen.active_params == pytest.approx(3.3e9, rel=0.02)
    for stats in (mixtral, qwen):
        experts = stats.expert_params
        assert stats.active_block_params == stats.block_params - experts + experts * stats.top_k // stats.num_experts
        # two FLOPs per parameter a token goes through and attention (the norms' weights are not matmuls: the
        # block's own norms are taken out, Qwen3's q/k norms inside attention are within the tolerance)
        norms = stats.profile.block.norms
        forward = 2 * (stats.active_block_params - norms) + 4 * 2048 * stats.q_width
        assert stats.block_forward_flops(2048) == pytest.approx(forward, rel=1e-5)


def test_eager_attention_keeps_what_grows_with_the_row():
    """Gemma 2 runs eager attention (no SDPA in transformers): its L x L scores are kept per head; SDPA keeps none."""
    gemma = ModelStats.from_config(load_model_config(TINY_GEMMA2))
    saved = gemma.profile.saved_bytes(2)
    assert saved.split_per_len > 0
    assert measured("llama-3-8b").profile.saved_bytes(2).split_per_len == 0
    short = block_activation_bytes_per_token(gemma, 2, seq_len=1024)
    long = block_activation_bytes_per_token(gemma, 2, seq_len=2048)
    assert long - short == pytest.approx(saved.split_per_len * 1024, abs=1)


def test_blocks_of_different_kinds_are_averaged():
    """DeepSeek-V3 starts with dense blocks (first_k_dense_replace): the block count is the mean of both kinds."""
    spec = CONVERTED_FAMILIES["deepseek_v3"]
    assert spec["first_k_dense_replace"] == 1 and spec["num_hidden_layers"] == 2
    stats = ModelStats.from_config(load_model_config(spec))
    assert 0 < stats.expert_params < stats.block_params
    assert stats.profile.block.experts == pytest.approx(stats.expert_params)
