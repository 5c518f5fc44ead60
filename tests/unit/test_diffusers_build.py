"""A diffusers transformer built from bigtrain's config of it: on ``meta`` it has every parameter diffusers' own
saved model has, by name and shape, so the values of a pipeline folder can be read into it once it is sharded."""

from __future__ import annotations

import pytest
import torch

from bigtrain.config.diffusers_config import read_folder

diffusers = pytest.importorskip("diffusers")


def test_the_meta_build_has_the_saved_model_s_parameters(tmp_path):
    from test_diffusers_config import _pipeline_folder

    from bigtrain.config.diffusers_config import construct

    folder = _pipeline_folder(tmp_path)
    with torch.device("meta"):
        model = construct(read_folder(folder, "model.name_or_path"))
    saved = diffusers.FluxTransformer2DModel.from_pretrained(folder / "transformer")
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == {
        k: tuple(v.shape) for k, v in saved.state_dict().items()
    }
    assert all(p.is_meta for p in model.parameters())
    blocks = [type(b).__name__ for b in (*model.transformer_blocks, *model.single_transformer_blocks)]
    assert blocks == list(model._no_split_modules)  # the units FSDP2 will shard: one double, one single block
