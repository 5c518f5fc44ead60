"""``model.task: text-to-image``: a diffusion transformer (diffusers' ``FluxTransformer2DModel`` or
``SD3Transformer2DModel``) fine-tuned on captioned images with rectified flow (``train.objective: flow-matching``), as
diffusers' ``train_dreambooth_flux.py`` and ``train_dreambooth_sd3.py`` train them.

``model.name_or_path`` is a diffusers pipeline folder (``model_index.json``): its transformer is the model trained,
built, sharded and checkpointed as every bigtrain model is (``config/diffusers_config.py``); its VAE and text
encoders are frozen, and their outputs for the data (latent distributions and prompt embeddings) are computed once
into the data cache (``data/encoded_images.py``), so they take no GPU memory during training. ``data.image_size``
(default 512) is the side images are trained at, ``data.seq_len`` (default 512) the text encoder's tokens.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigtrain.config.capabilities.table import first_unbuilt, row
from bigtrain.config.diffusers_types import CLASSES as PLANNED
from bigtrain.config.diffusers_types import VAE_SCALE, published_frozen_parts
from bigtrain.config.schema import RecipeConfig
from bigtrain.config.setup import DENOISED, Setup
from bigtrain.errors import ConfigError
from bigtrain.tasks import classifiers
from bigtrain.tasks.spec import Prepared, TaskSpec

CLASSES = {"flux_transformer": "FluxTransformer2DModel", "sd3_transformer": "SD3Transformer2DModel"}  # trained
DEFAULT_IMAGE_SIZE = 512  # diffusers' scripts' --resolution
# T5 tokens by default, each family's script's --max_sequence_length (train_dreambooth_flux.py's, _sd3.py's)
DEFAULT_TEXT_LEN = {"flux_transformer": 512, "sd3_transformer": 77}
SD3_CLIP_TOKENS = 77  # SD3's prompt embeddings: its CLIPs' tokens, then T5's


def pipeline_folder(cfg: RecipeConfig) -> Path:
    """The diffusers pipeline folder whose frozen parts (VAE, text encoders) the data is encoded with."""
    path = cfg.model.name_or_path
    if path is None or not (Path(path) / "model_index.json").is_file():
        raise ConfigError(
            "model.task=text-to-image needs model.name_or_path: a diffusers pipeline folder (model_index.json with "
            f"its transformer, VAE and text encoders), e.g. FLUX.1-dev's; got {path!r}"
        )
    return Path(path)


def scheduler_shift(pipeline: Path) -> float:
    """The shift the pipeline's flow-matching scheduler applies in training (none where it shifts dynamically, at
    inference only: FLUX)."""
    file = pipeline / "scheduler" / "scheduler_config.json"
    settings = json.loads(file.read_text()) if file.is_file() else {}
    return 1.0 if settings.get("use_dynamic_shifting", False) else float(settings.get("shift", 1.0))


def vae_config(pipeline: Path) -> dict[str, Any]:
    """The pipeline's VAE's config (its blocks halve an image's side at each but the last)."""
    file = pipeline / "vae" / "config.json"
    if not file.is_file():
        raise ConfigError(
            f"model.name_or_path: {pipeline} has no vae/config.json; a text-to-image pipeline needs its VAE"
        )
    return json.loads(file.read_text())


def check_positions(init: dict[str, Any], side: int, vae_blocks: int, bucketed: bool = False) -> None:
    """SD3's position embedding covers ``pos_embed_max_size`` patches a side: a longer side (the square's, or the
    longest bucket's) is one line."""
    most, patch = init.get("pos_embed_max_size"), int(init.get("patch_size", 2))
    patches = side // 2 ** (vae_blocks - 1) // patch
    if most and patches > most:
        largest = most * patch * 2 ** (vae_blocks - 1)
        what = f"the longest bucket side, {side} px," if bucketed else f"images of {side} px"
        raise ConfigError(
            f"data.image_size: {what} {'is' if bucketed else 'are'} {patches} patches a side, more than the "
            f"transformer's position embedding covers (pos_embed_max_size={most}); lower data.image_size until "
            f"every side is at most {largest} px"
        )


def read_data(cfg: RecipeConfig, hf_config: Any) -> tuple[Any, Any]:
    """The captioned images of ``data.path`` through the pipeline's frozen parts, and the held-out ones
    (``data.eval_path``, else ``data.eval_fraction`` of them), in aspect-ratio buckets with ``data.aspect_buckets``;
    with ``parallel.frozen_parts`` device or offloaded, the images and captions themselves, encoded at each step."""
    from bigtrain.config.capabilities.frozen_parts import LIVE, placement_of
    from bigtrain.data.aspect_buckets import bucket_sizes
    from bigtrain.data.denoise_batch import Noiser
    from bigtrain.data.encoded_images import EncodedImages, check_packable, read_encoded
    from bigtrain.data.held_out import with_held_out
    from bigtrain.data.noising import flow_of

    pipeline = pipeline_folder(cfg)
    side = cfg.data.image_size or DEFAULT_IMAGE_SIZE
    text_len = caption_tokens(cfg, hf_config)
    vae = vae_config(pipeline)
    blocks = len(vae["block_out_channels"])
    check_packable("data.image_size", side, blocks)
    sizes = bucket_sizes(side, 2**blocks) if cfg.data.aspect_buckets else [(side, side)]
    family = "sd3" if hf_config.model_type == "sd3_transformer" else "flux"
    if family == "sd3":
        check_positions(hf_config.init, max(max(size) for size in sizes), blocks, cfg.data.aspect_buckets)
    flow = flow_of(cfg.train, scheduler_shift(pipeline), "logit_normal" if family == "sd3" else "none")
    guidance = cfg.train.guidance_scale if hf_config.init.get("guidance_embeds") else None
    precondition = cfg.train.precondition_outputs
    precondition = family == "sd3" if precondition is None else precondition  # each script's default
    # AutoencoderKL's defaults where a config leaves them out
    scale, shift = float(vae.get("scaling_factor", 0.18215)), float(vae.get("shift_factor") or 0.0)
    noiser = Noiser(flow, scale, shift, guidance, family, precondition)
    latent, live = (int(vae.get("latent_channels", 4)), blocks), placement_of(cfg.parallel.options) in LIVE

    def read(key: str, path: str) -> EncodedImages:
        encoded, note = read_encoded(
            cfg.data, key, path, str(pipeline), sizes, text_len, latent, live, cfg.train.mixed_precision
        )
        return EncodedImages(
            encoded, noiser, cfg.train.seed, f"{path} ({encoded.described()})", text_len, cache_note=note,
            bucketed=cfg.data.aspect_buckets,
        )  # fmt: skip

    data, held = with_held_out(cfg, read("data.path", cfg.data.path), read, "images")
    # held-out images are noised by their own index, the same draws at every evaluation
    return data, None if held is None else dataclasses.replace(held, train=False)


def caption_tokens(cfg: RecipeConfig, hf_config: Any) -> int:
    """The T5 tokens a caption is cut or padded to: data.seq_len, else the family's script's default."""
    return cfg.data.seq_len or DEFAULT_TEXT_LEN[hf_config.model_type]


def prepare(cfg: RecipeConfig, hf_config: Any, data: Any) -> Prepared:
    """The captions cut, and what aspect-ratio buckets leave untrained, said (LoRA's default targets are the
    attention projections: ``config.hf.linear_names``)."""
    notes = []
    cut = data.encoded.captions_cut
    if cut:
        notes.append(
            f"data.path: {cut} caption(s) are longer than the text encoder's {data.text_len} tokens and were cut "
            "(data.seq_len)"
        )
    if data.row_groups is not None:
        notes.extend(bucket_notes(data, cfg.train.global_batch_size, cfg.data.shuffle))
    return Prepared(cfg, hf_config, tuple(notes))


def bucket_notes(data: Any, batch: int, shuffle: bool = True) -> list[str]:
    """Each global batch comes from one bucket: a bucket of fewer images than the batch never trains (an error if
    none holds a batch), and each epoch leaves out each bucket's remainder (another each epoch when shuffled, the
    same when not)."""
    import numpy as np

    sizes = data.encoded.sizes
    counts = np.bincount(data.row_groups, minlength=len(sizes))
    held = [(f"{w}x{h}", int(c)) for (w, h), c in zip(sizes, counts, strict=True) if c]
    if all(c < batch for _, c in held):
        raise ConfigError(
            f"data.aspect_buckets: each global batch comes from one bucket, and no bucket holds train.global_batch_size"
            f"={batch} images ({', '.join(f'{s}: {c}' for s, c in held)}); lower the global batch to at most "
            f"{max(c for _, c in held)}, or set data.aspect_buckets: false"
        )
    notes = []
    small = [(s, c) for s, c in held if c < batch]
    if small:
        notes.append(
            f"data.aspect_buckets: {sum(c for _, c in small)} image(s) are never trained: their buckets hold fewer "
            f"than a global batch ({batch}): {', '.join(f'{s}: {c}' for s, c in small)}"
        )
    left = sum(c % batch for _, c in held if c >= batch)
    if left:
        notes.append(
            f"data.aspect_buckets: each epoch trains {sum(c // batch * batch for _, c in held)} of {data.num_rows} "
            f"images, in whole global batches of one bucket; the {left} left over "
            + ("wait for a later epoch's shuffle" if shuffle else "never train (data.shuffle: false)")
        )
    return notes


def check(cfg: RecipeConfig, hf_config: Any, data: Any, attention: str, is_main: bool) -> list[str]:
    if hf_config.model_type not in CLASSES:
        raise ConfigError(
            f"model.task=text-to-image trains {', '.join(CLASSES.values())} so far; {hf_config.class_name} is "
            "planned (bigtrain plan) but not trained"
        )
    return []


def unverified_for_diffusion(s: Setup) -> str | None:
    """What a FLUX transformer has not been checked against the plain loop with (tests/distributed/
    test_text_to_image.py checks DDP, FSDP2, DeepSpeed ZeRO-2/3 with offload, LoRA and checkpointing), or was not
    equal to it with: ZeRO-3 with selective checkpointing, compile and replica groups."""
    from bigtrain.config.capabilities.replica_sync import settings_of

    p, t = s.plan, s.train
    return first_unbuilt(
        "text-to-image",
        (
            # FLUX's gradient through ZeRO-3's recompute of selected ops was 0.8% off the plain loop's at step 1
            ("parallel.activation_checkpointing", p.activation_checkpointing,
             p.backend == "deepspeed" and p.zero_stage == 3 and p.activation_checkpointing == "selective",
             "full (ZeRO-3's selective recompute is not exact for FLUX here)"),
            ("train.compile", str(t.compile).lower(), t.compile is True, "false"),
            ("parallel.sync", settings_of(p).mode, settings_of(p).mode != "every_step", "every_step"),
        ),
    )  # fmt: skip


RULES = (*classifiers.RULES, row(unverified_for_diffusion, "not_built", reads_micro_batch=True))


@dataclass(frozen=True)
class TextToImageSpec(TaskSpec):
    """A task whose models are diffusers' classes, not transformers': its classes by model type are its own (those
    it plans; ``check`` refuses to train those it does not train yet)."""

    def class_names(self) -> dict[str, Any]:
        return dict(PLANNED)


def workload(base: Any, data: Any, cfg: RecipeConfig) -> Any:
    """The side images are trained at (no bucket has more pixels than its square) and the text tokens the
    transformer reads (the prompt embeddings': SD3's CLIP tokens and T5's)."""
    side = cfg.data.image_size or DEFAULT_IMAGE_SIZE
    return dataclasses.replace(base, image_size=side, seq_len=data.encoded.text_tokens)


def sizes(ask: Any) -> dict[str, Any]:
    """The image side (the argument, the recipe's data.image_size, else 512), the text tokens (the argument, the
    recipe's data.seq_len, else 512; SD3 reads its CLIPs' 77 tokens before them) and the global batch (the argument,
    the recipe's, else 1 image per GPU)."""
    cfg, spell = ask.recipe, ask.spell
    side = ask.image_size or (cfg and cfg.data.image_size) or DEFAULT_IMAGE_SIZE
    if side % (2 * VAE_SCALE):
        raise ConfigError(
            f"{spell.value('image_size', side)} must be a multiple of {2 * VAE_SCALE} (the transformer's 2 x 2 patches)"
        )
    model_type = ask.model_config.get("model_type", "flux_transformer")
    length = ask.seq_len or (cfg and cfg.data.seq_len) or DEFAULT_TEXT_LEN.get(model_type, 512)
    if model_type == "sd3_transformer":
        length += SD3_CLIP_TOKENS
    batch = ask.global_batch_size or (cfg.train.global_batch_size if cfg else 0) or ask.gpus
    if batch % ask.gpus:
        lower = batch // ask.gpus * ask.gpus
        raise ConfigError(
            f"{spell.value('global_batch_size', batch)} does not divide over {ask.gpus} GPUs; try {lower or ask.gpus}"
        )
    return {"image_size": side, "seq_len": length, "global_batch_size": batch}


def synthetic(hf_config: Any, plan: Any, workload: Any, device: Any) -> Any:
    """A micro-batch as the data path makes it (values aside) at the workload's image side and text tokens."""
    from bigtrain.config.diffusers_config import denoise_inputs
    from bigtrain.data.encoded_images import DenoiseBatch

    b = plan.micro_batch_size
    inputs, target = denoise_inputs(hf_config, b, hf_config.latent_side(workload.image_size), workload.seq_len, device)
    sigmas = inputs["timestep"]
    import torch

    return DenoiseBatch(inputs, target, sigmas, torch.zeros(b, dtype=torch.int64, device=device))


def planner(model_config: dict[str, Any], workload: Any) -> Any:
    """The transformer's statistics measured on fake tensors at the workload's image tokens and text tokens, the
    classifier's memory and time terms (``planner/classifier_plan.py``), and the frozen parts' where the plan places
    them (``planner/frozen_parts.py``: the published pipeline's, for a transformer of its text widths)."""
    from bigtrain.planner import frozen_parts as fp
    from bigtrain.planner.classifier_plan import classifier_model

    planned = classifier_model(model_config, workload, with_text=True)
    model_type = model_config.get("model_type")
    # a pipeline folder's own parts (``config/diffusers_config.frozen_parts``), else the published pipeline's
    known = model_config.get("frozen_parts") or published_frozen_parts(model_type, model_config.get("init", {}))
    if not known:
        return planned
    frozen = fp.FrozenParts(tuple(fp.FrozenPart(*part) for part in known), clip_first=model_type == "sd3_transformer")
    base = planned.headline

    def memory(stats: Any, plan: Any, w: Any) -> Any:
        return fp.with_frozen_memory(planned.memory(stats, plan, w), frozen, plan, w)

    def time(stats: Any, plan: Any, cluster: Any, w: Any) -> Any:
        return fp.with_frozen_time(planned.time(stats, plan, cluster, w), frozen, plan, cluster, w)

    def host(stats: Any, plan: Any, w: Any) -> int:
        return planned.host(stats, plan, w) + fp.frozen_host_bytes(frozen, plan, w)

    def headline(stats: Any, w: Any) -> str:
        return f"{base(stats, w)}\n  frozen parts: {frozen.described()} params, placed by parallel.frozen_parts"

    def choice_note(candidate: Any, cluster: Any) -> list[str]:
        """The chosen placement, and the same plan's peak and step time with each other one."""
        w = dataclasses.replace(workload, method=candidate.method)
        return fp.placement_note(
            frozen,
            candidate,
            cluster,
            lambda plan: (memory(planned.stats, plan, w), time(planned.stats, plan, cluster, w)),
        )

    return dataclasses.replace(planned, memory=memory, time=time, host=host, headline=headline, choice_note=choice_note)


def facts(hf_config: Any) -> dict[str, bool]:
    return {"batch_norm": False, "convolutional": False, "block_linears": True}


TASK = TextToImageSpec(
    name="text-to-image",
    summary="diffusion transformers (FLUX, SD3): captioned images, frozen VAE and text encoders placed, flow matching",
    auto_class="",
    mapping="",
    suffix=None,
    auto=False,  # named only: model.task: text-to-image
    unit="images",
    outputs=DENOISED,
    default_objective="flow-matching",
    built_objectives=("flow-matching",),
    read_data=read_data,
    prepare=prepare,
    check=check,
    model_facts=facts,
    planner=planner,
    sizes=sizes,
    synthetic=synthetic,
    workload=workload,
    count=classifiers.count_examples,
    peft_task_type=None,
    keys=(
        "data.path",
        "data.eval_path",
        "data.eval_fraction",
        "data.image_size",
        "data.seq_len",
        "data.aspect_buckets",
        "parallel.frozen_parts",
    ),
    rules=RULES,
    example={
        "model_type": "flux_transformer",
        "patch_size": 1,
        "in_channels": 16,
        "num_layers": 1,
        "num_single_layers": 1,
        "attention_head_dim": 8,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "pooled_projection_dim": 16,
        "guidance_embeds": False,
        "axes_dims_rope": [2, 2, 4],
    },  # fmt: skip
)
