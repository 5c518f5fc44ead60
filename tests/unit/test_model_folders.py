"""Model folders transformers cannot read are one line each, before anything is built: a config.json that is not
JSON, and a model whose config names its own code (which transformers would run, or ask about on every rank's
terminal) without ``model.trust_remote_code``."""

from __future__ import annotations

import json

import pytest

from bigtrain.config.schema import ModelConfig
from bigtrain.errors import ConfigError
from bigtrain.models.build import load_hf_config


def test_a_config_json_that_is_not_json_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 64,}')  # a trailing comma
    with pytest.raises(ConfigError) as e:
        load_hf_config(ModelConfig(name_or_path=str(tmp_path)))
    assert str(e.value) == (
        f"model.name_or_path={str(tmp_path)!r}: {tmp_path / 'config.json'} is not valid JSON (Expecting property name "
        "enclosed in double quotes: line 1 column 43 (char 42)); fix or re-save the file"
    )


@pytest.fixture
def own_code(tmp_path):
    auto_map = {"AutoConfig": "configuration_mine.MyConfig", "AutoModelForCausalLM": "modeling_mine.MyModel"}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mine", "auto_map": auto_map}))
    (tmp_path / "configuration_mine.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    return tmp_path


def test_a_model_of_its_own_code_runs_nothing_without_trust_remote_code(own_code):
    with pytest.raises(ConfigError, match=r"names its own Python code \(auto_map, model_type 'mine'\).*"
                       r"unless model.trust_remote_code=true"):  # fmt: skip
        load_hf_config(ModelConfig(name_or_path=str(own_code)))
    assert not (own_code / "ran").exists()


def test_trust_remote_code_runs_the_folder_s_code_and_still_refuses_to_train_it(own_code):
    (own_code / "configuration_mine.py").write_text(
        f"open({str(own_code / 'ran')!r}, 'w').close()\n"
        "from transformers import PretrainedConfig\n\n"
        "class MyConfig(PretrainedConfig):\n    model_type = 'mine'\n"
    )
    with pytest.raises(ConfigError, match="is the folder's own code \\(auto_map\\), not a family transformers ships"):
        load_hf_config(ModelConfig(name_or_path=str(own_code), trust_remote_code=True))
    assert (own_code / "ran").exists()


def test_a_run_s_final_model_not_trained_yet_says_which_run_to_train_first():
    """docs/preference.md's DPO step reads the SFT step's final model (chat_demo/run/model): skipped, or failed, it
    is not a bare "not a local HF model folder" but which run writes it."""
    with pytest.raises(ConfigError) as e:
        load_hf_config(ModelConfig(name_or_path="chat_demo/run/model"))
    assert str(e.value) == (
        "model.name_or_path='chat_demo/run/model' is not a local HF model folder (no config.json); a run writes its "
        "final model to output_dir/model: first train the recipe whose output_dir is 'chat_demo/run' (or save a "
        "model there with model.save_pretrained(PATH))"
    )
