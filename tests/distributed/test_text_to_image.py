"""A diffusion transformer (``model.task: text-to-image``, ``train.objective: flow-matching``) on real multi-rank
plans against a plain single-process loop.

The plain loop is written from diffusers' ``train_dreambooth_flux.py``: the tiny FLUX pipeline's VAE encodes each
image (16 x 16 px, so no resize: its pixels / 127.5 - 1) and ``FluxPipeline.encode_prompt`` its caption; every step
takes the global batch's examples in the data order of ``test_equivalence.py``, and each example (at global position
p) draws from its own generator (seeded with crc32 of "seed:p", as bigtrain documents): a sample of its latent
distribution (shifted and scaled by the VAE's factors), the noise, and u (uniform: weighting_scheme none); the
timestep is the scheduler's ``timesteps[int(u N)]`` and sigma its ``sigmas`` there (the tiny scheduler shifts by 3);
the transformer reads the noisy latents packed by ``FluxPipeline._pack_latents`` with its image ids, the prompt
embeddings and timestep / 1000; the loss is the mean over the batch of each example's mean squared error of the
unpacked prediction against noise - latents; AdamW, ``clip_grad_norm_`` and the schedule of ``test_equivalence.py``.
Compared each step: the loss and the gradient norm; then every trained parameter.

Cases, each with accumulation (micro-batches of 2 on 2 ranks: 2 per step): DDP x 2, FSDP2 x 2, and peft's LoRA on
the attention projections on FSDP2 x 2; then checkpointing (FSDP2 selective, every other block; ZeRO-2 full) and
LoRA on ZeRO-3 with both offloads, every other block checkpointed. (ZeRO-3 with selective checkpointing gave a
gradient norm 0.8% off at step 1 here: refused for this task.) Then DDP x 2 and FSDP2 x 2 on images of three aspect
ratios (16 x 16, 20 x 12 and 12 x 20 px: the tiny pipeline's buckets at 16 px, so no resize) with
data.aspect_buckets, against the loop drawing each step's batch from one bucket (``bucketed_rows``). And DDP x 2
with the frozen parts on each rank's device (``parallel.frozen_parts: device``), encoding each micro-batch's images
and captions at its step instead of reading them from the data cache. The teeth: draws
keyed by each rank's own position instead of the global one.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from diffusion_cases import IMAGE_SIZE, TEXT_LEN, captioned_folder, pipeline_folder
from helpers import read_metrics, recipe_dict
from shared_launch import SharedLaunches, launch_key, selected
from test_equivalence import BETAS, CLIP, EPS, GLOBAL_BATCH, NUM_ROWS, SEED, global_batch_rows, lr_lambda
from test_equivalence import train_section as sft_train_section

from bigtrain.parallel.transforms.adapters import initial_lora_A

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.full  # each launch starts 2 ranks that import diffusers (~40 s a case on 2 cores)

STEPS, LR, R, ALPHA = 6, 2e-3, 4, 8
RTOL, ATOL, PARAM_ATOL = 1e-5, 1e-6, 2e-5
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
CASES = {
    "ddp": (2, dict(backend="ddp", micro_batch_size=2), "full"),
    "fsdp2": (2, dict(backend="fsdp2", micro_batch_size=2), "full"),
    "lora-fsdp2": (2, dict(backend="fsdp2", micro_batch_size=2), "lora"),
    "zero2-ac-full": (
        2,
        dict(backend="deepspeed", zero_stage=2, micro_batch_size=2, activation_checkpointing="full"),
        "full",
    ),
    "lora-zero3-offload-ac-every2": (
        2,
        dict(
            backend="deepspeed",
            zero_stage=3,
            micro_batch_size=2,
            offload_optimizer=True,
            offload_params=True,
            activation_checkpointing="full",
            checkpoint_every=2,
        ),
        "lora",
    ),
    "fsdp2-ac-selective": (2, dict(backend="fsdp2", micro_batch_size=2, activation_checkpointing="selective"), "full"),
    "fsdp2-ac-every2": (
        2,
        dict(backend="fsdp2", micro_batch_size=2, activation_checkpointing="full", checkpoint_every=2),
        "full",
    ),
    # the VAE and text encoders on each rank's device, encoding every micro-batch (parallel.frozen_parts)
    "ddp-frozen-parts-on-device": (2, dict(backend="ddp", micro_batch_size=2, frozen_parts="device"), "full"),
    # images of three aspect ratios in their buckets (data.aspect_buckets), each global batch from one
    "ddp-buckets": (2, dict(backend="ddp", micro_batch_size=2), "full"),
    "fsdp2-buckets": (2, dict(backend="fsdp2", micro_batch_size=2), "full"),
}
# (height, width) px: the tiny pipeline's buckets at 16 px are 20 x 12, 16 x 16 and 12 x 20 (w x h)
BUCKET_SHAPES = [(16, 16), (12, 20), (20, 12)]


def encoded(pipeline, images):
    """Each image's latent distribution (mean, std) and each caption's embeddings, as the script computes them (the
    images are at their bucket's size, or the square's: no resize)."""
    import json

    from PIL import Image

    pipe = diffusers.FluxPipeline.from_pretrained(str(pipeline), transformer=None)
    rows = [json.loads(line) for line in (images / "metadata.jsonl").read_text().splitlines()]
    means, stds = [], []
    with torch.no_grad():
        for r in rows:
            image = torch.from_numpy(np.array(Image.open(images / r["file_name"]).convert("RGB"))).permute(2, 0, 1)
            dist = pipe.vae.encode(image[None].float() / 127.5 - 1.0).latent_dist
            means.append(dist.mean[0])
            stds.append(dist.std[0])
        embeds, pooled, _ = pipe.encode_prompt([r["text"] for r in rows], None, max_sequence_length=TEXT_LEN)
    return means, stds, embeds, pooled, pipe.vae.config


def bucketed_rows(step: int, buckets: np.ndarray) -> np.ndarray:
    """Rows of step ``step`` with aspect-ratio buckets, as bigtrain documents its order: epoch e (seeded by
    SEED + e) shuffles each bucket's rows (in bucket order), cuts them into whole global batches and shuffles those
    batches; the steps run through the epochs' batches."""
    epochs = []
    while True:
        rng = np.random.default_rng(SEED + len(epochs))
        batches = []
        for bucket in sorted(set(buckets.tolist())):
            rows = np.flatnonzero(buckets == bucket)
            rows = rows[rng.permutation(len(rows))]
            batches += [
                rows[i : i + GLOBAL_BATCH] for i in range(0, len(rows) // GLOBAL_BATCH * GLOBAL_BATCH, GLOBAL_BATCH)
            ]
        epochs.append([batches[j] for j in rng.permutation(len(batches))])
        if sum(map(len, epochs)) > step:
            return [b for e in epochs for b in e][step]


def draws(position: int, mean, std, scheduler):
    g = torch.Generator().manual_seed(zlib.crc32(f"{SEED}:{position}".encode()))
    sample = mean + std * torch.randn(mean.shape, generator=g)
    noise = torch.randn(mean.shape, generator=g)
    u = torch.rand(1, generator=g)
    index = int(u * scheduler.config.num_train_timesteps)
    return sample, noise, scheduler.timesteps[index], scheduler.sigmas[index]


def with_adapters(model):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_A." in name:
                own = name.removeprefix("base_model.model.").replace(".default", "")
                param.copy_(initial_lora_A(own, tuple(param.shape), SEED))
    return model


def train_steps(model, loss_of) -> list[dict]:
    """The scripts' optimizer loop around ``loss_of(step)``, the step's loss over its global batch: AdamW, the
    schedule and clipping of ``test_equivalence.py``; the loss and the gradient norm of each step."""
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=LR, betas=BETAS, eps=EPS, weight_decay=sft_train_section()["weight_decay"])
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_lambda(step, STEPS))
    out = []
    for step in range(STEPS):
        loss = loss_of(step)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(trained, CLIP)
        opt.step()
        schedule.step()
        opt.zero_grad()
        out.append({"loss": loss.item(), "grad_norm": norm.item()})
    return out


def plain_loop(pipeline, images, method: str = "full", per_rank: bool = False, buckets: bool = False):
    """(metrics per step, trained parameters) of the script's loop; ``per_rank``: the mistake of keying each
    example's draws by its place in its rank's share of the step instead of its global position; ``buckets``: the
    images in aspect-ratio buckets (their shapes), each global batch from one."""
    mean, std, embeds, pooled, vae = encoded(pipeline, images)
    ratios = [m.shape[-1] / m.shape[-2] for m in mean]  # each latent's width / height
    shapes = np.array([sorted(set(ratios)).index(r) for r in ratios])  # buckets from the tallest to the widest
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_pretrained(pipeline / "scheduler")
    model = diffusers.FluxTransformer2DModel.from_pretrained(pipeline / "transformer")
    if method == "lora":
        model = with_adapters(model)

    def loss_of(step: int) -> torch.Tensor:
        at = bucketed_rows(step, shapes) if buckets else global_batch_rows(step)
        b = len(at)
        positions = [step * b + j for j in range(b)]
        if per_rank:
            positions = [step * b + j % (b // 2) for j in range(b)]
        drawn = [draws(p, mean[i], std[i], scheduler) for p, i in zip(positions, at, strict=True)]
        latents = (torch.stack([d[0] for d in drawn]) - vae.shift_factor) * vae.scaling_factor
        noise = torch.stack([d[1] for d in drawn])
        timesteps = torch.stack([d[2] for d in drawn])
        sigmas = torch.stack([d[3] for d in drawn]).view(-1, 1, 1, 1)
        noisy = (1.0 - sigmas) * latents + sigmas * noise
        c, h, w = latents.shape[1:]
        packed = diffusers.FluxPipeline._pack_latents(noisy, b, c, h, w)
        ids = diffusers.FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, "cpu", torch.float32)
        prediction = model(
            hidden_states=packed, timestep=timesteps / 1000, guidance=None, pooled_projections=pooled[at],
            encoder_hidden_states=embeds[at], txt_ids=torch.zeros(TEXT_LEN, 3), img_ids=ids, return_dict=False,
        )[0]  # fmt: skip
        # the pipeline's vae_scale_factor: 2 for the tiny VAE of two blocks (its images are 2h x 2w px)
        prediction = diffusers.FluxPipeline._unpack_latents(prediction, h * 2, w * 2, 2)
        target = noise - latents
        return torch.mean(((prediction.float() - target.float()) ** 2).reshape(b, -1), 1).mean()

    out = train_steps(model, loss_of)
    if method == "lora":
        names = {n.removeprefix("base_model.model.").replace(".default", ""): p for n, p in model.named_parameters()}
        return out, {k: p.detach().clone() for k, p in names.items() if p.requires_grad}
    return out, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("text_to_image")
    pipeline = pipeline_folder(root)
    square = captioned_folder(root, NUM_ROWS, shape=(IMAGE_SIZE, IMAGE_SIZE))
    return pipeline, square, captioned_folder(root / "buckets", NUM_ROWS, seed=1, shape=BUCKET_SHAPES)


def _bucketed(name: str) -> bool:
    return name.endswith("-buckets")


@pytest.fixture(scope="module")
def loops(inputs):
    cache: dict = {}

    def get(method: str = "full", buckets: bool = False):
        if (method, buckets) not in cache:
            pipeline, square, mixed = inputs
            cache[method, buckets] = plain_loop(pipeline, mixed if buckets else square, method=method, buckets=buckets)
        return cache[method, buckets]

    return get


def t2i_recipe(pipeline, images, parallel: dict, method: str, **data_keys):
    """The maker of a case's recipe (``recipe(output_dir) -> dict``): the equivalence test's training section, the
    tiny pipeline's image side and text tokens, ``data_keys`` beside them."""

    def make(out):
        train = {**sft_train_section(STEPS), "lr": LR, "method": method}
        data = {"shuffle": True, "seq_len": TEXT_LEN, "image_size": IMAGE_SIZE, "cache_dir": str(out.parent / "cache")}
        sections = dict(data=data | data_keys, train=train, parallel=parallel, checkpoint={"save_final_model": False})
        if method == "lora":
            sections["lora"] = {"r": R, "alpha": ALPHA, "dropout": 0.0}  # the task's own targets: TARGETS
        made = recipe_dict(out, images, pipeline, **sections)
        made["model"]["task"] = "text-to-image"
        return made

    return make


def recipe(inputs, name: str):
    _, parallel, method = CASES[name]
    pipeline, square, mixed = inputs
    if _bucketed(name):
        return t2i_recipe(pipeline, mixed, parallel, method, aspect_buckets=True)
    return t2i_recipe(pipeline, square, parallel, method)


def check_matches(launched, metrics, reference_params) -> None:
    """A launched case's metrics equal the plain loop's at every step, and its parameters at the end."""
    launched.check_finished()
    got = read_metrics(launched.output_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for step, (mine, ref) in enumerate(zip(got, metrics, strict=True), 1):
        for key in ("loss", "grad_norm"):
            assert mine[key] == pytest.approx(ref[key], rel=RTOL, abs=ATOL), f"step {step} {key}"
    params = torch.load(launched.params)
    assert set(params) == set(reference_params)
    for key, ref in reference_params.items():
        torch.testing.assert_close(params[key], ref, rtol=0, atol=PARAM_ATOL, msg=lambda m, k=key: f"{k}: {m}")


@pytest.fixture(scope="module")
def launches(inputs, tmp_path_factory, request):
    shared = SharedLaunches(tmp_path_factory, "text_to_image")
    chosen = selected(request.session, "test_text_to_image_plan_matches_the_plain_loop", "name")
    cases = {n: (launch_key(CASES[n][0], CASES[n][1]), recipe(inputs, n)) for n in chosen}
    return lambda name: shared.get(name, cases)


@pytest.mark.parametrize("name", list(CASES))
def test_text_to_image_plan_matches_the_plain_loop(name, launches, loops):
    metrics, reference_params = loops(CASES[name][2], _bucketed(name))
    launched = launches(name)
    check_matches(launched, metrics, reference_params)
    if "frozen-parts" in name:  # the data cache kept each image's bucket only: the parts encoded at every step
        assert list((launched.output_dir.parent / "cache").glob("image-buckets-*")), "the frozen parts did not run"


def test_the_loop_learns_and_draws_per_rank_are_caught(inputs, loops):
    metrics, _ = loops()
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    wrong, _ = plain_loop(*inputs[:2], per_rank=True)
    worst = max(abs(w[k] - r[k]) / max(abs(r[k]), 1e-3) for w, r in zip(wrong[1:], metrics[1:], strict=True)
                for k in ("loss", "grad_norm"))  # fmt: skip
    assert worst > 10 * RTOL, worst
