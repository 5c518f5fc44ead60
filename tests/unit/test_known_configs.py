"""The recorded presets (``planner/known_configs.json``) are what transformers gives now: every entry recomputed.

The file is read only while the transformers it was made with is installed; a different one fails here first, so
a new release (or a preset edited without rewriting the file) announces itself instead of planning from a stale
copy or silently taking the slow path."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from bigtrain.planner import known_configs
from bigtrain.tasks import record_presets
from bigtrain.planner.model_stats import load_model_config, preset_names

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
