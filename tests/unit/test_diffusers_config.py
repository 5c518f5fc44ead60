"""A diffusers transformer's config as a ``PretrainedConfig`` (``config/diffusers_config.py``): read from a pipeline
folder or a transformer's folder as diffusers writes them, from ``model.config``, and back from its own dict; the
width and depth the planner reads; the model diffusers builds from it; bad folders in one line."""

from __future__ import annotations

import copy
import json

import pytest

from bigtrain.config.diffusers_config import from_dict, read_folder, weights_folder
from bigtrain.errors import ConfigError

diffusers = pytest.importorskip("diffusers")
# diffusers' own tiny FLUX (tests/models/transformers/test_models_transformer_flux.py)
TINY_FLUX = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8],
                 guidance_embeds=True)  # fmt: skip


def _pipeline_folder(root):
    diffusers.FluxTransformer2DModel(**TINY_FLUX).save_pretrained(root / "transformer")
    index = {"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]}
    (root / "model_index.json").write_text(json.dumps(index))
    return root


def test_a_pipeline_folder_s_transformer_reads_as_a_config_of_its_width_and_depth(tmp_path):
    cfg = read_folder(_pipeline_folder(tmp_path), "model.name_or_path")
    assert cfg.model_type == "flux_transformer" and cfg.class_name == "FluxTransformer2DModel"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (32, 2, 2)
    assert read_folder(tmp_path / "transformer", "k").init == cfg.init
    assert weights_folder(tmp_path) == tmp_path / "transformer"
    assert (weights_folder(tmp_path) / f"{cfg.weights_stem}.safetensors").is_file()
    built = diffusers.FluxTransformer2DModel.from_config(cfg.diffusers_config())
    saved = diffusers.FluxTransformer2DModel.from_pretrained(tmp_path / "transformer")
    own = lambda config: {k: v for k, v in config.items() if k not in ("_diffusers_version", "_name_or_path")}  # noqa: E731
    assert own(built.config) == own(saved.config)


def test_the_config_survives_a_copy_its_dict_and_its_folder(tmp_path):
    cfg = from_dict({"model_type": "flux_transformer", **TINY_FLUX}, "model.config")
    assert copy.deepcopy(cfg).init == cfg.init == TINY_FLUX
    assert from_dict(cfg.to_dict(), "k").init == TINY_FLUX
    cfg.save_pretrained(tmp_path)
    assert from_dict(json.loads((tmp_path / "config.json").read_text()), "k").init == TINY_FLUX


def test_what_is_no_diffusion_transformer_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"'UNet2DConditionModel' is not a diffusion transformer bigtrain trains"):
        from_dict({"_class_name": "UNet2DConditionModel"}, "model.name_or_path")
    (tmp_path / "model_index.json").write_text(
        json.dumps({"_class_name": "StableDiffusionPipeline", "unet": [], "vae": []})
    )
    with pytest.raises(ConfigError, match=r"the pipeline StableDiffusionPipeline has no transformer \(unet, vae\)"):
        read_folder(tmp_path, "model.name_or_path")
