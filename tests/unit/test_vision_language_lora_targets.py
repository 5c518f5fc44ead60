"""LoRA on a vision-language model: the language model's linears by default (the tower's own ``*_proj`` of the same
names are left alone), the vision tower's when ``lora.target_modules`` names them; only the adapters train."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bigtrain.config.schema import AdapterConfig
from bigtrain.parallel.transforms.adapters import adapted_linears, inject_adapters

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
from make_vlm_demo import save_tiny_vlm  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "qwen", "qwen2_5_vl")


def _adapted(folder: Path, lora: AdapterConfig) -> list[str]:
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(folder)
    inject_adapters(model, lora)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n for n in trained)  # only the adapters train
    return [name for name, _ in adapted_linears(model)]


def test_by_default_the_language_model_s_linears_and_none_of_the_tower_s(folder):
    adapted = _adapted(folder, AdapterConfig(r=4))
    assert adapted and all(".language_model." in n for n in adapted)
    assert any(n.endswith("mlp.gate_proj") for n in adapted)  # the tower has gate_proj too: not adapted


def test_the_vision_tower_s_when_target_modules_name_them(folder):
    adapted = _adapted(folder, AdapterConfig(r=4, target_modules=[r".*\.visual\.blocks\.\d+\.attn\.(qkv|proj)"]))
    assert sorted(adapted) == [f"model.visual.blocks.{b}.attn.{p}" for b in (0, 1) for p in ("proj", "qkv")]
