"""The DeepSpeed JSON of a plan: templates filled from the recipe, user files checked against it (config/deepspeed.py)."""

from __future__ import annotations

import json

import pytest

from bigtrain.config.deepspeed import TEMPLATES, TEMPLATES_DIR, deepspeed_config, template_name
from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import ParallelConfig, RecipeConfig, TrainConfig
from bigtrain.errors import ConfigError


def recipe(**parallel) -> RecipeConfig:
    cfg = RecipeConfig(train=TrainConfig(global_batch_size=32, grad_clip=0.5, mixed_precision="bf16"))
    cfg.parallel = ParallelConfig(backend="deepspeed", micro_batch_size=2, **parallel)
    return cfg


def filled(cfg: RecipeConfig, world: int = 4) -> dict:
    plan = resolve_plan(cfg.parallel, world, cfg.train)
    return deepspeed_config(cfg, plan, hidden_size=64)


def test_every_template_exists_and_is_filled_completely():
    assert sorted(p.stem for p in TEMPLATES_DIR.glob("*.json")) == sorted(TEMPLATES)
    for parallel in (
        dict(zero_stage=1),
        dict(zero_stage=2),
        dict(zero_stage=3),
        dict(zero_stage=2, offload_optimizer=True),
        dict(zero_stage=3, offload_optimizer=True, offload_params=True),
    ):
        cfg = recipe(**parallel)
        out = filled(cfg)
        text = json.dumps(out)
        assert '"auto"' not in text
        # 32 = 2 per rank x 4 ranks x 4 micro-steps
        assert (out["train_batch_size"], out["train_micro_batch_size_per_gpu"]) == (32, 2)
        assert out["gradient_accumulation_steps"] == 4 and out["gradient_clipping"] == 0.5
        assert out["bf16"]["enabled"] is True and out["fp16"]["enabled"] is False
        zero = out["zero_optimization"]
        assert zero["stage"] == parallel["zero_stage"] and zero["reduce_bucket_size"] == 64 * 64
        plan = resolve_plan(cfg.parallel, 4, TrainConfig(global_batch_size=32))
        offloads = zero.get("offload_optimizer", {}).get("device", "none")
        assert offloads == ("cpu" if plan.offload_optimizer else "none")
        if plan.zero_stage == 3:
            assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 64 * 64)
            assert zero["stage3_param_persistence_threshold"] == 640
    assert template_name(resolve_plan(recipe(zero_stage=3, offload_optimizer=True).parallel, 4, TrainConfig(global_batch_size=32))) == "zero3-offload"


def test_a_user_file_keeps_what_agrees_and_names_both_sides_of_a_contradiction(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"gradient_accumulation_steps": 8, "zero_optimization": {"stage": 2}}))
    with pytest.raises(ConfigError) as e:
        filled(recipe(zero_stage=2, deepspeed_config=str(path)))
    assert "gradient_accumulation_steps=8 in parallel.deepspeed_config=" in str(e.value)
    assert "recipe and plan give 4" in str(e.value)
    path.write_text(json.dumps({"gradient_accumulation_steps": 4, "zero_optimization": {"stage": 2, "foo": 1}}))
    out = filled(recipe(zero_stage=2, deepspeed_config=str(path)))
    assert out["zero_optimization"]["foo"] == 1 and out["train_batch_size"] == 32  # filled where absent
    path.write_text(json.dumps({"bf16": {"enabled": False}}))
    with pytest.raises(ConfigError, match=r"bf16.enabled=false .* give true \(train.mixed_precision\)"):
        filled(recipe(zero_stage=2, deepspeed_config=str(path)))


@pytest.mark.parametrize(
    "content, expected",
    [
        ({"optimizer": {"type": "AdamW"}}, 'has a "optimizer" section, but the optimizer and the schedule come from'),
        ({"zero_optimization": {"stage": 2, "sub_group_size": "auto"}}, "does not fill: zero_optimization.sub_group"),
        ({"zero_optimization": {"stage": 3}}, "zero_optimization.stage=3 in"),
        ({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}, 'offload_optimizer.device="cpu"'),
    ],
)
def test_bad_user_files_are_one_line(tmp_path, content, expected):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ConfigError) as e:
        filled(recipe(zero_stage=2, deepspeed_config=str(path)))
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_a_missing_or_broken_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        filled(recipe(deepspeed_config=str(tmp_path / "nope.json")))
    (tmp_path / "bad.json").write_text('{"zero_optimization": {')
    with pytest.raises(ConfigError, match="is not valid JSON: .* line 1"):
        filled(recipe(deepspeed_config=str(tmp_path / "bad.json")))


def test_what_the_deepspeed_engine_does_not_take_is_refused_before_it_starts():
    import torch

    from bigtrain.config.hf import hf_config_from_dict
    from bigtrain.engine import build_options

    cfg = recipe(zero_stage=2)
    cfg.train.compile = True
    with pytest.raises(ConfigError, match="train.compile=true .* set train.compile=false or use backend fsdp2"):
        resolve_plan(cfg.parallel, 4, cfg.train)
    cfg.train.compile = False
    plan = resolve_plan(cfg.parallel, 4, cfg.train)
    hf_config = hf_config_from_dict({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})
    options = build_options(cfg, hf_config, plan, torch.device("cpu"))  # the filled template is fine
    assert options.deepspeed_config["zero_optimization"]["stage"] == 2
