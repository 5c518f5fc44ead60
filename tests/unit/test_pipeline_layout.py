"""How pipeline parallelism cuts a model: which layers each stage holds, which stages each rank runs, what the
validator refuses, and that the stages chained together compute exactly the whole model (one process, no groups)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from cases import TINY_LLAMA
from helpers import check_fit

from bigtrain.config.hf import hf_config_from_dict
from bigtrain.config.pipeline import stage_layer_ranges, stages_of_rank
from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import ParallelConfig, TrainConfig
from bigtrain.errors import ConfigError
from bigtrain.parallel.transforms.pipeline_split import build_stages

LLAMA_4 = {**TINY_LLAMA, "num_hidden_layers": 4, "tie_word_embeddings": False}


def plan(world=2, batch=8, **parallel):
    return resolve_plan(ParallelConfig(**parallel), world, TrainConfig(global_batch_size=batch))


def test_layers_split_evenly_with_the_remainder_on_the_first_stages():
    assert stage_layer_ranges(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layer_ranges(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert [len(r) for r in stage_layer_ranges(32, 6)] == [6, 6, 5, 5, 5, 5]


def test_stages_of_each_rank_loop_or_form_a_v():
    looped = plan(world=4, pp=4, pp_virtual_stages=2, pp_schedule="interleaved_1f1b")
    assert [stages_of_rank(r, looped) for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    v = dataclasses.replace(looped, pp_schedule="zbv_zero_bubble")  # refused by resolve_plan, still laid out
    assert [stages_of_rank(r, v) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert stages_of_rank(1, plan(pp=2)) == [1]


def test_pipelined_plans_reduce_gradients_once_per_step():
    assert plan(pp=2).grad_reduce == "once_per_step"


@pytest.mark.parametrize(
    "model, parallel, batch, expected",
    [
        (LLAMA_4, dict(pp=2, pp_virtual_stages=3, pp_schedule="interleaved_1f1b"), 8, "= 6 stages exceeds the model's 4 decoder layers"),
        (LLAMA_4, dict(pp=2, pp_virtual_stages=2), 8, "pp_virtual_stages=2 needs a multi-stage schedule"),
        (LLAMA_4, dict(pp=2, micro_batch_size=4), 4, "pp_schedule=1f1b needs at least 2 micro-batches per step, but train.global_batch_size=4"),
        (LLAMA_4, dict(pp=2, pp_virtual_stages=2, pp_schedule="interleaved_1f1b"), 5, "5 is not a multiple of its 2 rounds"),
        (TINY_LLAMA, dict(pp=2), 8, "ties its LM head to its embeddings (tie_word_embeddings=true)"),
        ({**TINY_LLAMA, "model_type": "gpt2"}, dict(pp=2), 8, "model_type 'gpt2' ships no pipeline layout"),
    ],
)  # fmt: skip
def test_pipelines_that_cannot_run_are_refused_by_key(model, parallel, batch, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        check_fit(hf_config_from_dict(model), plan(batch=batch, **parallel), batch)


def test_pipelines_that_fit_are_accepted():
    config = hf_config_from_dict(LLAMA_4)
    check_fit(config, plan(pp=2, pp_schedule="gpipe", micro_batch_size=4), 4)
    check_fit(config, plan(pp=2, pp_virtual_stages=2, pp_schedule="interleaved_1f1b"), 8)
    check_fit(config, plan(pp=2, pp_virtual_stages=2, pp_schedule="looped_bfs"), 8)


@pytest.mark.parametrize("schedule", ["interleaved_zero_bubble", "zbv_zero_bubble", "dual_pipe_v"])
def test_split_backward_schedules_are_refused_until_they_train_the_same_model(schedule):
    with pytest.raises(ConfigError, match=f"pp_schedule={schedule} .* does not train the same model"):
        plan(pp=2, pp_virtual_stages=2, pp_schedule=schedule)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_stages_chained_compute_the_whole_model_under_its_own_names(model_type):
    from transformers import AutoModelForCausalLM

    config = hf_config_from_dict({**LLAMA_4, "model_type": model_type})
    torch.manual_seed(0)
    whole = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    stages_plan = plan(world=2, pp=2, pp_virtual_stages=2, pp_schedule="interleaved_1f1b")
    stages = build_stages(whole, config, stages_plan, [0, 1, 2, 3])
    names = [set(dict(stage.named_parameters())) for stage in stages]
    assert set().union(*names) == set(dict(whole.named_parameters()))  # every parameter once, under its HF name
    assert sum(map(len, names)) == len(dict(whole.named_parameters()))
    assert any(n.startswith("model.layers.3.") for n in names[3]) and "lm_head.weight" in names[3]
    assert "model.embed_tokens.weight" in names[0] and not any("layers.1." in n for n in names[0])
    ids = torch.randint(0, config.vocab_size, (2, 9))
    with torch.no_grad():
        x = ids
        for stage in stages:
            x = stage(x)
        torch.testing.assert_close(x, whole(input_ids=ids).logits, rtol=0, atol=1e-6)
