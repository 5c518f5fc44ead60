"""An SD3 transformer (``model.task: text-to-image``) on real multi-rank plans against a plain single-process loop
written from diffusers' ``train_dreambooth_sd3.py`` at its defaults (``--weighting_scheme logit_normal``,
``--precondition_outputs 1``).

The loop: the tiny SD3 pipeline's VAE encodes each 16 x 16 px image (no resize: its pixels / 127.5 - 1) and
``StableDiffusion3Pipeline.encode_prompt`` its caption (two CLIPs' penultimate states padded to T5's width, then T5's
states; the CLIPs' pooled projections side by side; no classifier-free guidance). Each example (at global position p)
draws from its own generator, as in ``test_text_to_image.py``: a sample of its latent distribution (shifted and
scaled), the noise, and u by ``compute_density_for_timestep_sampling("logit_normal")``; the timestep is the
scheduler's ``timesteps[int(u N)]`` (shift 3), sigma its ``sigmas`` there. The transformer reads the noisy latents as
they are and the timestep; the prediction is preconditioned (prediction x -sigma + the noisy input) and compared with
the clean latents, weighted by ``compute_loss_weighting_for_sd3``, per example mean then batch mean. AdamW,
``clip_grad_norm_`` and the schedule of ``test_equivalence.py``.

Cases, each with accumulation (micro-batches of 2 on 2 ranks): DDP x 2, FSDP2 x 2 and LoRA on FSDP2 x 2. The
teeth: the loss without preconditioning (FLUX's) is far off.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from diffusion_cases import IMAGE_SIZE, TEXT_LEN, captioned_folder, sd3_pipeline_folder
from shared_launch import SharedLaunches, launch_key, selected
from test_equivalence import NUM_ROWS, SEED, global_batch_rows
from test_text_to_image import RTOL, check_matches, t2i_recipe, train_steps, with_adapters

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.full

CASES = {
    "sd3-ddp": (2, dict(backend="ddp", micro_batch_size=2), "full"),
    "sd3-fsdp2": (2, dict(backend="fsdp2", micro_batch_size=2), "full"),
    "sd3-lora-fsdp2": (2, dict(backend="fsdp2", micro_batch_size=2), "lora"),
}


def encoded(pipeline, images):
    """Each image's latent distribution (mean, std), each caption's embeddings and pooled vector, the VAE's config."""
    import json

    import numpy as np
    from PIL import Image

    pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(str(pipeline), transformer=None)
    rows = [json.loads(line) for line in (images / "metadata.jsonl").read_text().splitlines()]
    pixels = [torch.from_numpy(np.array(Image.open(images / r["file_name"]).convert("RGB"))) for r in rows]
    with torch.no_grad():
        dist = pipe.vae.encode(torch.stack(pixels).permute(0, 3, 1, 2).float() / 127.5 - 1.0).latent_dist
        embeds, _, pooled, _ = pipe.encode_prompt(
            [r["text"] for r in rows], None, None, do_classifier_free_guidance=False, max_sequence_length=TEXT_LEN
        )
    return dist.mean, dist.std, embeds, pooled, pipe.vae.config


def plain_loop(pipeline, images, method: str = "full", precondition: bool = True):
    """(metrics per step, trained parameters) of the SD3 script's loop (``precondition``: its --precondition_outputs)."""
    from diffusers.training_utils import compute_density_for_timestep_sampling, compute_loss_weighting_for_sd3

    mean, std, embeds, pooled, vae = encoded(pipeline, images)
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_pretrained(pipeline / "scheduler")
    model = diffusers.SD3Transformer2DModel.from_pretrained(pipeline / "transformer")
    if method == "lora":
        model = with_adapters(model)

    def loss_of(step: int) -> torch.Tensor:
        at = global_batch_rows(step)
        b = len(at)
        samples, noise, indices = [], [], []
        for j, i in enumerate(at):
            g = torch.Generator().manual_seed(zlib.crc32(f"{SEED}:{step * b + j}".encode()))
            samples.append(mean[i] + std[i] * torch.randn(mean[i].shape, generator=g))
            noise.append(torch.randn(mean[i].shape, generator=g))
            u = compute_density_for_timestep_sampling("logit_normal", 1, 0.0, 1.0, generator=g)
            indices.append(int(u * scheduler.config.num_train_timesteps))
        latents = (torch.stack(samples) - vae.shift_factor) * vae.scaling_factor
        noise = torch.stack(noise)
        timesteps = scheduler.timesteps[indices]
        sigmas = scheduler.sigmas[indices].view(-1, 1, 1, 1)
        noisy = (1.0 - sigmas) * latents + sigmas * noise
        prediction = model(
            hidden_states=noisy, timestep=timesteps, encoder_hidden_states=embeds[at], pooled_projections=pooled[at],
            return_dict=False,
        )[0]  # fmt: skip
        if precondition:
            prediction = prediction * (-sigmas) + noisy
        weighting = compute_loss_weighting_for_sd3("logit_normal", sigmas)
        target = latents if precondition else noise - latents
        return torch.mean((weighting.float() * (prediction.float() - target.float()) ** 2).reshape(b, -1), 1).mean()

    out = train_steps(model, loss_of)
    if method == "lora":  # the adapters, and the buffers (SD3's position embedding) a run's state holds beside them
        names = {n.removeprefix("base_model.model.").replace(".default", ""): p for n, p in model.named_parameters()}
        kept = {k: p.detach().clone() for k, p in names.items() if p.requires_grad}
        return out, kept | {n.removeprefix("base_model.model."): b.clone() for n, b in model.named_buffers()}
    return out, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sd3")
    return sd3_pipeline_folder(root), captioned_folder(root, NUM_ROWS, shape=(IMAGE_SIZE, IMAGE_SIZE))


@pytest.fixture(scope="module")
def loops(inputs):
    cache: dict = {}

    def get(method: str):
        if method not in cache:
            cache[method] = plain_loop(*inputs, method=method)
        return cache[method]

    return get


@pytest.fixture(scope="module")
def launches(inputs, tmp_path_factory, request):
    shared = SharedLaunches(tmp_path_factory, "sd3")
    chosen = selected(request.session, "test_sd3_plan_matches_the_plain_loop", "name")
    cases = {n: (launch_key(CASES[n][0], CASES[n][1]), t2i_recipe(*inputs, *CASES[n][1:])) for n in chosen}
    return lambda name: shared.get(name, cases)


@pytest.mark.parametrize("name", list(CASES))
def test_sd3_plan_matches_the_plain_loop(name, launches, loops):
    metrics, reference_params = loops(CASES[name][2])
    check_matches(launches(name), metrics, reference_params)


def test_the_sd3_loop_learns_and_its_loss_without_preconditioning_is_caught(inputs, loops):
    metrics, _ = loops("full")
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    wrong, _ = plain_loop(*inputs, precondition=False)
    worst = max(abs(w["loss"] - r["loss"]) / abs(r["loss"]) for w, r in zip(wrong, metrics, strict=True))
    assert worst > 10 * RTOL, worst
