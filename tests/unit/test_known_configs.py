"""The recorded presets (``planner/known_configs.json``) are what transformers gives now: every entry recomputed.

The file is read only while the transformers it was made with is installed; a different one fails here first, so
a new release (or a preset edited without rewriting the file) announces itself instead of planning from a stale
copy or silently taking the slow path."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from bigtrain.planner import known_configs
from bigtrain.planner.model_stats import load_model_config, preset_names
from bigtrain.tasks import record_presets

RECORDED = json.loads(resources.files("bigtrain.planner").joinpath(known_configs.FILE).read_text())
REWRITE = "rewrite it: python -m bigtrain.tasks.record_presets"


def test_recorded_with_the_installed_transformers():
    installed = known_configs.transformers_version()
    assert RECORDED["transformers"] == installed, (
        f"recorded with {RECORDED['transformers']}, {installed} installed; {REWRITE}"
    )
    assert sorted(RECORDED["presets"]) == sorted(preset_names()), REWRITE


@pytest.mark.parametrize("preset", preset_names())
def test_a_recorded_preset_is_what_transformers_gives(preset):
    assert RECORDED["presets"][preset] == json.loads(json.dumps(record_presets.live_entry(preset))), REWRITE


def test_a_preset_plans_from_its_record_and_a_copy_is_returned():
    config = load_model_config("llama-3-8b")
    assert config == RECORDED["presets"]["llama-3-8b"]["config"]
    config["hidden_size"] = 1
    assert load_model_config("llama-3-8b")["hidden_size"] == 4096
    assert known_configs.recorded_facts(load_model_config("llama-3-8b")).tp_styles
    assert known_configs.recorded_facts(config) is None  # a changed dict is asked of transformers


# fields of the published config.json files (meta-llama/Meta-Llama-3-8B, mistralai/Mistral-7B-v0.1, Qwen/Qwen2.5-7B,
# openai-community/gpt2), typed by hand, with the parameter counts their checkpoints hold
PUBLISHED = {
    "llama-3-8b": (dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                        intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False), 8_030_261_248),
    "mistral-7b": (dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                        intermediate_size=14336, vocab_size=32000, tie_word_embeddings=False), 7_241_732_096),
    "qwen2.5-7b": (dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                        intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False), 7_615_616_512),
    "gpt2": (dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257), 124_439_808),
}  # fmt: skip


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_a_recorded_preset_is_the_published_model(preset):
    """The record the planner reads, transformers' AutoConfig built from it, and the parameters of the model
    transformers builds from it (on the meta device) against the published figures: a preset mistyped in
    presets.json and recorded again fails here, where the record-vs-recompute test above passes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from bigtrain.planner.model_stats import ModelStats

    fields, params = PUBLISHED[preset]
    assert known_configs.recorded_config(preset) is not None  # planned from the record, no transformers call
    config = load_model_config(preset)
    auto = AutoConfig.for_model(**config)
    for key, value in fields.items():
        assert config[key] == value and getattr(auto, key) == value, (preset, key)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(auto)
    assert sum(p.numel() for p in model.parameters()) == params
    assert ModelStats.from_config(config).params == params
