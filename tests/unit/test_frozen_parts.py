"""A text-to-image pipeline's frozen parts run during training (``parallel.frozen_parts``: device, offloaded) give the
transformer the micro-batch the data cache gives (``cached``): the same images, captions and draws through the same
VAE and text encoders, on the tiny FLUX and SD3 pipelines. And the planner's FLOPs of FLUX's VAE encoder are what
torch's FlopCounterMode counts on diffusers' AutoencoderKL built from FLUX.1-dev's config."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusion_cases import IMAGE_SIZE, TEXT_LEN, captioned_folder, pipeline_folder, sd3_pipeline_folder
from helpers import recipe_dict, write_recipe

pytest.importorskip("diffusers")

BUCKET_SHAPES = [(16, 16), (12, 20), (20, 12)]  # (height, width): the tiny pipeline's three buckets at 16 px


def _data(tmp_path, pipeline, images, placement: str):
    from bigtrain.config.load import load_recipe
    from bigtrain.models.build import load_hf_config
    from bigtrain.tasks.text_to_image import read_data

    data = {"seq_len": TEXT_LEN, "image_size": IMAGE_SIZE, "cache_dir": str(tmp_path / "cache")}
    data |= {"aspect_buckets": True, "eval_fraction": 0.25}
    made = recipe_dict(tmp_path / placement, images, pipeline, data=data, parallel={"frozen_parts": placement})
    made["model"]["task"] = "text-to-image"
    cfg = load_recipe(write_recipe(tmp_path / f"{placement}.yaml", made))
    return cfg, read_data(cfg, load_hf_config(cfg.model))


@pytest.mark.parametrize("family,placement", [("flux", "device"), ("flux", "offloaded"), ("sd3", "device")])
def test_frozen_parts_run_at_each_step_give_the_cached_micro_batch(tmp_path, family, placement):
    from bigtrain.data.denoise_batch import ImageBatch
    from bigtrain.roles.frozen_parts import FrozenParts

    pipeline = pipeline_folder(tmp_path) if family == "flux" else sd3_pipeline_folder(tmp_path)
    images = captioned_folder(tmp_path, 12, shape=BUCKET_SHAPES)
    _, (cached, cached_held) = _data(tmp_path, pipeline, images, "cached")
    cfg, (live, live_held) = _data(tmp_path, pipeline, images, placement)
    assert live.encoded.live and not cached.encoded.live
    assert live.encoded.text_tokens == cached.encoded.text_tokens == cached.encoded.prompt_embeds.shape[1]
    assert live.description == cached.description and live.num_rows == cached.num_rows == 9
    role = FrozenParts(pipeline, placement, torch.device("cpu"), cfg.train.mixed_precision)
    assert cached_held is not None and live_held is not None and not live_held.train
    assert live.encoded.captions_cut == cached.encoded.captions_cut
    for mine, theirs in ((live, cached), (live_held, cached_held)):
        for bucket in np.unique(theirs.row_groups):
            # a step's micro-batches of one row each (its captions encoded together, its images one micro-batch
            # at a time), keyed by their global positions
            rows = [np.array([r]) for r in np.flatnonzero(theirs.row_groups == bucket)[:2]]
            seen = [np.array([7]), np.array([30])][: len(rows)]
            raw = [mine.micro_batch(r, s) for r, s in zip(rows, seen, strict=True)]
            assert all(isinstance(b, ImageBatch) and b.labels.tolist() == [0] for b in raw)
            got = role.attach_step([b.to(torch.device("cpu")) for b in raw])
            for one, r, s in zip(got, rows, seen, strict=True):
                want = theirs.micro_batch(r, s)
                assert one.inputs.keys() == want.inputs.keys() and one.preconditioned == want.preconditioned
                for key in want.inputs:
                    torch.testing.assert_close(one.inputs[key], want.inputs[key], rtol=1e-5, atol=1e-6, msg=key)
                torch.testing.assert_close(one.target, want.target, rtol=1e-5, atol=1e-6)
                assert torch.equal(one.sigmas, want.sigmas) and torch.equal(one.labels, want.labels)
    # an encoded micro-batch (a simulated step's) passes through
    encoded = cached.micro_batch(np.array([0]))
    assert role.attach(encoded) is encoded


def test_the_planner_s_vae_flops_are_flopcountermode_s():
    from diffusers import AutoencoderKL
    from torch.utils.flop_counter import FlopCounterMode

    from bigtrain.planner.frozen_parts import VAE_ATTENTION_FLOPS, VAE_CONV_FLOPS

    # FLUX.1-dev's vae/config.json (SD3's has the same blocks and latent channels)
    with torch.device("meta"):
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
            up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[128, 256, 512, 512], layers_per_block=2,
            latent_channels=16, norm_num_groups=32, use_quant_conv=False, use_post_quant_conv=False,
        )  # fmt: skip
    for side in (256, 512):
        with FlopCounterMode(display=False) as counted, torch.no_grad():
            vae.encode(torch.empty(1, 3, side, side, device="meta"))
        pixels = side * side
        assert VAE_CONV_FLOPS * pixels + VAE_ATTENTION_FLOPS * pixels**2 == pytest.approx(
            counted.get_total_flops(), rel=1e-3
        )


def test_frozen_parts_on_the_device_add_their_weights_to_the_planned_and_the_simulated_peak(tmp_path, cli_in_process):
    """A recipe's pipeline folder's parts, counted from their files' headers: what ``device`` adds to the predicted
    peak is what the simulated step holds more (fp32 here: 4 bytes each), and ``cached`` adds nothing."""
    import json

    from bigtrain.config.diffusers_config import frozen_parts

    pipeline, images = pipeline_folder(tmp_path), captioned_folder(tmp_path, 8)
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(pipeline), transformer=None)
    parts = frozen_parts(pipeline)
    counted = {name: sum(p.numel() for p in getattr(pipe, name).parameters()) for name, _, _ in parts}
    assert [[name, counted[name]] for name, _, _ in parts] == [part[:2] for part in parts]
    assert [part[2] for part in parts] == ["clip", "t5", "pixels"]
    data = {"seq_len": TEXT_LEN, "image_size": IMAGE_SIZE, "cache_dir": str(tmp_path / "cache")}
    made = recipe_dict(tmp_path / "out", images, pipeline, data=data, train={"mixed_precision": "fp32"})
    made["model"]["task"] = "text-to-image"
    recipe = str(write_recipe(tmp_path / "recipe.yaml", made))
    peaks = {}
    for placement in ("cached", "device"):
        args = ["plan", recipe, "--gpus", "2", "--gpu", "A100-80GB", "--simulate", "--json"]
        done = cli_in_process([*args, "--fix", f"frozen_parts={placement}", "--fix", "backend=ddp"])
        assert done.returncode == 0, done.stderr
        said = json.loads(done.stdout)
        peaks[placement] = said["memory"]["total_bytes"], said["simulated"]["peak_bytes"]
    weights = 4 * sum(count for _, count, _ in parts)
    assert peaks["device"][0] - peaks["cached"][0] == weights
    assert peaks["device"][1] - peaks["cached"][1] == weights
