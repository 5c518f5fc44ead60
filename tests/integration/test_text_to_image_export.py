"""A text-to-image run's final folders load in diffusers and hold what was trained: a full run's model folder is a
``FluxTransformer2DModel.from_pretrained`` folder whose values are the last checkpoint's; a LoRA run's adapter is a
``pytorch_lora_weights.safetensors`` that ``FluxPipeline.load_lora_weights`` reads, and the pipeline's transformer
then predicts what the base with the checkpoint's adapters merged by hand (W + alpha / r x B A) predicts. ``bigtrain
generate`` on either run's folder draws the picture diffusers' pipeline draws with the trained model loaded by hand.
An SD3 run's LoRA loads in ``StableDiffusion3Pipeline`` the same way. The terminal says nothing but bigtrain's own
lines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusion_cases import IMAGE_SIZE, TEXT_LEN, captioned_folder, pipeline_folder, sd3_pipeline_folder
from helpers import recipe_dict, run_cli, write_recipe
from PIL import Image

from bigtrain.config.diffusers_config import denoise_inputs, read_folder

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.full

R, ALPHA = 4, 8


def _train(tmp_path, pipeline, images, method: str, name: str = ""):
    train = {"steps": 3, "global_batch_size": 4, "lr": 1e-2, "method": method, "mixed_precision": "fp32"}
    data = {"seq_len": TEXT_LEN, "image_size": IMAGE_SIZE}
    sections = dict(data=data, train=train, parallel={"backend": "fsdp2", "micro_batch_size": 2})
    if method == "lora":
        sections["lora"] = {"r": R, "alpha": ALPHA}
    name = name or method
    recipe = recipe_dict(tmp_path / name, images, pipeline, **sections)
    recipe["model"]["task"] = "text-to-image"
    proc = run_cli(["train", str(write_recipe(tmp_path / f"{name}.yaml", recipe)), "--nproc", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith(("bigtrain:", "train:"))]
    assert not said, "\n".join(said)
    return tmp_path / name


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("t2i_export")
    return pipeline_folder(root), captioned_folder(root, 8)


def _generated(run, tmp_path, prompt: str = "a disk", said: str = "", size=(IMAGE_SIZE, IMAGE_SIZE)):
    """The picture ``bigtrain generate`` draws from a run's folder (2 steps, seed 5; ``size``: (width, height), the
    square by default), as an array; ``said``: the one line it writes to stderr (none: nothing)."""
    out = tmp_path / f"{run.name}.png"
    asked = [] if size == (IMAGE_SIZE, IMAGE_SIZE) else ["--size", f"{size[0]}x{size[1]}"]
    proc = run_cli(["generate", str(run), "--prompt", prompt, "--out", str(out), "--steps", "2", "--seed", "5", *asked])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"generate: wrote {out} ({size[0]}x{size[1]} px, 2 steps, seed 5)"
    assert proc.stderr.strip() == said, proc.stderr
    return np.asarray(Image.open(out))


def _drawn(pipe, prompt: str = "a disk", size=(IMAGE_SIZE, IMAGE_SIZE)):
    """What diffusers' pipeline draws at the run's side (or ``size``) and text tokens, with the same steps and seed."""
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(5)
    image = pipe(
        prompt, num_inference_steps=2, height=size[1], width=size[0], max_sequence_length=TEXT_LEN,
        generator=generator,
    ).images[0]  # fmt: skip
    return np.asarray(image)


def _checkpoint(run):
    from bigtrain.checkpoint.adapter_export import read_adapters
    from bigtrain.checkpoint.layout import resolve_checkpoint
    from bigtrain.config.load import load_recipe

    folder = resolve_checkpoint(run)
    return read_adapters(folder, load_recipe(folder / "recipe.yaml"))


def _predict(model, pipeline):
    torch.manual_seed(3)
    inputs, _ = denoise_inputs(read_folder(pipeline, "k"), 2, IMAGE_SIZE // 2, TEXT_LEN)
    with torch.no_grad():
        return model(**inputs).sample


def test_a_full_run_s_model_folder_loads_in_diffusers_with_the_trained_values(tmp_path, inputs):
    pipeline, images = inputs
    run = _train(tmp_path, pipeline, images, "full")
    trained = diffusers.FluxTransformer2DModel.from_pretrained(run / "model")
    base = diffusers.FluxTransformer2DModel.from_pretrained(pipeline / "transformer")
    assert trained.state_dict().keys() == base.state_dict().keys()
    assert not torch.allclose(_predict(trained, pipeline), _predict(base, pipeline))  # it trained
    # the model folder's values are the last checkpoint's: exported again from it, byte for byte the same
    proc = run_cli(["export-model", str(run), "-o", str(tmp_path / "again")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = diffusers.FluxTransformer2DModel.from_pretrained(tmp_path / "again")
    for key, value in trained.state_dict().items():
        torch.testing.assert_close(again.state_dict()[key], value, rtol=0, atol=0)
    by_hand = diffusers.FluxPipeline.from_pretrained(str(pipeline), transformer=trained)
    np.testing.assert_array_equal(_generated(run, tmp_path), _drawn(by_hand))


def test_a_lora_run_s_adapter_loads_in_the_pipeline_and_predicts_as_merged_by_hand(tmp_path, inputs):
    pipeline, images = inputs
    run = _train(tmp_path, pipeline, images, "lora")
    assert (run / "adapter" / "pytorch_lora_weights.safetensors").is_file()
    pipe = diffusers.FluxPipeline.from_pretrained(str(pipeline))
    pipe.load_lora_weights(str(run / "adapter"))
    got = _predict(pipe.transformer, pipeline)
    np.testing.assert_array_equal(_generated(run, tmp_path), _drawn(pipe))
    # a prompt longer than the run's text tokens (one a byte here) is cut, in one line
    cut = f"generate: --prompt is 12 tokens; cut to the {TEXT_LEN} the run trained with (data.seq_len)"
    np.testing.assert_array_equal(_generated(run, tmp_path, "a large disk", cut), _drawn(pipe, "a large disk"))
    # another width and height than the square (a bucket's)
    np.testing.assert_array_equal(_generated(run, tmp_path, size=(20, 12)), _drawn(pipe, size=(20, 12)))

    adapters = _checkpoint(run / "checkpoints")
    merged = diffusers.FluxTransformer2DModel.from_pretrained(pipeline / "transformer")
    with torch.no_grad():
        for name, a in adapters.items():
            if ".lora_A." not in name:
                continue
            module = name.split(".lora_A.")[0]
            b = adapters[f"{module}.lora_B.weight"]
            merged.get_submodule(module).weight += ALPHA / R * b @ a
    torch.testing.assert_close(got, _predict(merged, pipeline), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(
        got, _predict(diffusers.FluxTransformer2DModel.from_pretrained(pipeline / "transformer"), pipeline)
    )


def test_an_sd3_run_s_adapter_loads_in_its_pipeline_and_generate_draws_with_it(tmp_path, inputs):
    pipeline = sd3_pipeline_folder(tmp_path)
    run = _train(tmp_path, pipeline, inputs[1], "lora", "sd3-lora")
    pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(str(pipeline))
    base = _drawn(pipe)
    pipe.load_lora_weights(str(run / "adapter"))
    adapted = _drawn(pipe)
    np.testing.assert_array_equal(_generated(run, tmp_path), adapted)
    assert not np.array_equal(adapted, base)  # the adapters it trained change the picture
