"""Pretrained values come through transformers' own key renaming and weight conversion: for GPT-NeoX (its LM head is
``embed_out`` on disk), Mixtral, Qwen3-MoE and DeepSeek-V3 (per-expert tensors on disk, fused per layer in the
model), what bigtrain's one-module-at-a-time loader reads equals what ``from_pretrained`` loads, and the way back
gives the checkpoint's own keys and tensors; attention auto is the family's own default."""

from __future__ import annotations

import pytest
import torch
from cases import CONVERTED_FAMILIES
from helpers import save_tiny_model
from safetensors.torch import load_file

from bigtrain.config.hf import hf_config_from_dict
from bigtrain.models.checkpoint_keys import ConvertedCheckpoint, to_checkpoint_keys
from bigtrain.models.materialize import full_values


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: save_tiny_model(root / name, spec=spec) for name, spec in CONVERTED_FAMILIES.items()}


def _meta(spec):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config_from_dict(spec))


@pytest.mark.parametrize("family", list(CONVERTED_FAMILIES))
def test_the_loader_reads_what_from_pretrained_loads(family, folders):
    from transformers import AutoModelForCausalLM

    expected = AutoModelForCausalLM.from_pretrained(folders[family]).state_dict()
    twin = _meta(CONVERTED_FAMILIES[family])
    wanted = {name for name, _ in twin.named_parameters()}
    got = {name: value.clone() for name, value, _ in full_values(twin, wanted, str(folders[family]), seed=0)}
    assert set(got) == wanted
    for name in wanted:
        assert torch.equal(got[name], expected[name]), name
    on_disk = set(load_file(str(folders[family] / "model.safetensors")))
    assert on_disk != wanted  # the family's checkpoint keys are not the model's names: a conversion was needed


@pytest.mark.parametrize("family", ["mixtral", "gpt_neox"])
def test_the_way_back_gives_the_checkpoint_s_keys_and_tensors(family, folders):
    twin = _meta(CONVERTED_FAMILIES[family])
    checkpoint = ConvertedCheckpoint(folders[family], twin)
    values = {name: checkpoint.get(name) for name, _ in twin.named_parameters()}
    on_disk = load_file(str(folders[family] / "model.safetensors"))
    back = to_checkpoint_keys(twin, values)
    assert set(back) == set(on_disk)
    for key, tensor in on_disk.items():
        assert torch.equal(back[key], tensor), key


def test_experts_are_stacked_in_expert_order_not_string_order(tmp_path):
    """Twelve experts: a string sort would put expert 10 before expert 2."""
    from transformers import AutoModelForCausalLM

    spec = {**CONVERTED_FAMILIES["mixtral"], "num_local_experts": 12, "num_hidden_layers": 1}
    folder = save_tiny_model(tmp_path / "mixtral12", spec=spec)
    expected = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    twin = _meta(spec)
    fused = "model.layers.0.mlp.experts.down_proj"
    got = dict((n, v.clone()) for n, v, _ in full_values(twin, {fused}, str(folder), seed=0))
    assert torch.equal(got[fused], expected[fused])


def test_attention_auto_is_the_family_s_own_default():
    from cases import TINY_GEMMA2, TINY_LLAMA

    from bigtrain.config.hf import attention_choices, resolve_attention

    gemma2, llama = hf_config_from_dict(TINY_GEMMA2), hf_config_from_dict(TINY_LLAMA)
    assert resolve_attention(gemma2, "auto") == "eager" and "sdpa" not in attention_choices(gemma2)
    assert resolve_attention(llama, "auto") == "sdpa" and resolve_attention(llama, "eager") == "eager"
