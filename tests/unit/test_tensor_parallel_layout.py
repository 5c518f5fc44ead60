"""Which models tensor parallelism can split, and how: the layout is the model's own transformers data."""

from __future__ import annotations

import pytest
from cases import TINY_LLAMA
from helpers import check_fit, make_plan

from bigtrain.config.capabilities import ModelFacts
from bigtrain.config.hf import hf_config_from_dict, tp_layout
from bigtrain.errors import ConfigError
from bigtrain.models.build import build_meta_model
from bigtrain.parallel.transforms.tensor_parallel import tp_module_plan
from bigtrain.planner.model_stats import FORMULA_FAMILIES, ModelStats, load_model_config


def config(**overrides):
    return hf_config_from_dict({**TINY_LLAMA, **overrides})


@pytest.mark.parametrize(
    "overrides, tp, expected",
    [
        ({}, 3, "parallel.tp=3 does not divide num_attention_heads=4; try 1, 2"),
        ({}, 4, "parallel.tp=4 does not divide num_key_value_heads=2; try 1, 2"),
        ({"model_type": "gpt2"}, 2, "model_type 'gpt2' ships no tensor-parallel layout"),
        ({"model_type": "mixtral"}, 2, "model_type 'mixtral' uses the style(s) moe_tp_experts, packed_colwise"),
    ],
)
def test_tp_that_cannot_split_the_model_is_refused_by_name(overrides, tp, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        check_fit(config(**overrides), make_plan(tp=tp))


@pytest.mark.parametrize(
    "overrides, tp, expected",
    [
        (
            {},
            2,
            "parallel.loss_parallel=true shards the LM head over the vocabulary, but this model ties it to the input "
            "embeddings (tie_word_embeddings=true), which stay whole; set parallel.loss_parallel=false",
        ),
        (
            {"tie_word_embeddings": False, "vocab_size": 130, "num_key_value_heads": 4},
            4,
            "parallel.loss_parallel=true: parallel.tp=4 does not divide vocab_size=130; use a tp in 1, 2 or pad the "
            "vocabulary to a multiple of 4",
        ),
    ],
)
def test_a_vocabulary_parallel_head_must_be_untied_and_split_evenly(overrides, tp, expected):
    with pytest.raises(ConfigError) as e:
        check_fit(config(**overrides), make_plan(tp=tp, loss_parallel=True))
    assert str(e.value) == expected
    check_fit(config(tie_word_embeddings=False), make_plan(tp=2, loss_parallel=True))


def test_tp_that_divides_the_heads_is_accepted():
    check_fit(config(), make_plan(tp=2))
    check_fit(config(model_type="gpt2"), make_plan(tp=1))  # no layout needed without tensor parallelism


@pytest.mark.parametrize("model_type", FORMULA_FAMILIES)
def test_the_planner_and_the_trainer_read_the_same_facts_of_every_family(model_type):
    """The capability table reads the same facts in the planner (its statistics) and the trainer (the HF config),
    and they agree with the counts the planner's memory terms use, so both refuse the same plans."""
    stats = ModelStats.from_config(load_model_config({"model_type": model_type, "tie_word_embeddings": False}))
    facts = ModelFacts.of(hf_config_from_dict({"model_type": model_type, "tie_word_embeddings": False}))
    assert stats.facts == facts
    counts = (stats.layers, stats.heads, stats.kv_heads, stats.vocab, stats.tied, stats.model_type)
    assert counts == (facts.layers, facts.heads, facts.kv_heads, facts.vocab, facts.tied, facts.model_type)


def test_the_layout_expands_to_every_projection_of_every_block():
    cfg = config(num_hidden_layers=3)
    plan = tp_module_plan(build_meta_model(cfg, "sdpa").base_model, tp_layout(cfg))
    assert len(plan) == 3 * 7
    assert type(plan["layers.2.self_attn.q_proj"]).__name__ == "ColwiseParallel"
    assert type(plan["layers.0.mlp.down_proj"]).__name__ == "RowwiseParallel"


def test_sequence_parallel_puts_every_norm_on_the_tp_mesh_and_ends_row_wise_projections_on_sequence_shards():
    """On meta with a fake 2-rank group: the block norms and the final norm become replicated DTensors (their inputs
    arrive as sequence shards; the equivalence tests check the numbers); the embeddings and a replicated (tied) head
    stay plain tensors."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from bigtrain.parallel.transforms.tensor_parallel import apply_tensor_parallel

    cfg = config(num_hidden_layers=2)
    model = build_meta_model(cfg, "sdpa")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        apply_tensor_parallel(model, cfg, init_device_mesh("cpu", (2,)), sequence_parallel=True)
    finally:
        dist.destroy_process_group()
    norms = {n: p for n, p in model.named_parameters() if "norm" in n}
    assert len(norms) == 2 * 2 + 1
    assert all(isinstance(p, DTensor) and p.placements == (Replicate(),) for p in norms.values())
    assert model.model.layers[1].self_attn.q_proj.weight.placements == (Shard(0),)
    assert not isinstance(model.model.embed_tokens.weight, DTensor)
    assert not isinstance(model.lm_head.weight, DTensor)
