"""Every tensor-parallel style that the installed transformers ships in a family's ``base_model_tp_plan`` is either
mapped onto torch's DTensor styles or refused by name with a reason. A transformers release that brings a new style
(5.24's ``embedding_rowwise`` for GPT-NeoX) fails here, in one test, instead of in a training run."""

from __future__ import annotations

import pytest
from cases import TINY_LLAMA
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from bigtrain.config.hf import REFUSED_TP_STYLES, TP_STYLES
from bigtrain.parallel.transforms.tensor_parallel import _torch_style


def _shipped_styles() -> dict[str, list[str]]:
    """style -> the model types whose config class ships it."""
    styles: dict[str, list[str]] = {}
    for model_type in CONFIG_MAPPING.keys():
        try:
            config_class = CONFIG_MAPPING[model_type]
        except (ImportError, KeyError):  # a family whose optional dependency is missing
            continue
        for style in set((getattr(config_class, "base_model_tp_plan", None) or {}).values()):
            styles.setdefault(style, []).append(model_type)
    return styles


def test_every_shipped_style_is_mapped_or_refused_by_name():
    shipped = _shipped_styles()
    assert "colwise" in shipped and "rowwise" in shipped  # the scan reads real layouts
    unknown = {
        style: types[:5] for style, types in shipped.items() if style not in TP_STYLES + tuple(REFUSED_TP_STYLES)
    }
    assert not unknown, f"tensor-parallel styles neither mapped nor refused (style: some families): {unknown}"


@pytest.mark.parametrize("style", TP_STYLES)
def test_every_mapped_style_has_a_torch_style(style):
    assert _torch_style(style, sequence_parallel=False) is not None


@pytest.mark.parametrize(
    "style, reason", [("packed_colwise", "fused gate/up"), ("brand_new_style", "unknown to bigtrain")]
)
def test_a_layout_with_an_unmapped_style_is_refused_naming_it(style, reason):
    from dataclasses import replace

    from helpers import make_plan

    from bigtrain.config.capabilities import Setup, first_problem
    from bigtrain.config.hf import hf_config_from_dict
    from bigtrain.config.model_facts import ModelFacts

    facts = ModelFacts.of(hf_config_from_dict(dict(TINY_LLAMA)))
    assert first_problem(Setup(make_plan(backend="fsdp2", tp=2), model=facts)) is None  # the plain layout runs
    facts = replace(facts, tp_styles=(*facts.tp_styles, style))
    problem = first_problem(Setup(make_plan(backend="fsdp2", tp=2), model=facts))
    line = problem.message if problem else ""
    assert style in line and reason in line and "parallel.tp=1" in line
