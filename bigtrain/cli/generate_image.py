"""``bigtrain generate OUTPUT_DIR --prompt TEXT [--out picture.png] [--steps N] [--seed S]``: a text-to-image run's
picture for a prompt, without writing Python.

The folder is a text-to-image run's ``output_dir`` or a diffusers pipeline folder (``model_index.json``: the base
model's picture). A run's folder holds its ``recipe.yaml``, which names the pipeline it trained from
(``model.name_or_path``; ``--pipeline`` when that folder has moved), the side it trained at (``data.image_size``), its
text tokens (``data.seq_len``) and the guidance it gave a guidance-distilled transformer (``train.guidance_scale``),
and ``model/`` (a transformer trained fully: it replaces the pipeline's) or ``adapter/`` (LoRA weights, read by the
pipeline's own ``load_lora_weights``). diffusers' pipeline then denoises ``--steps`` times from noise seeded by
``--seed``, on the GPU in bf16 where there is one, else on the CPU in fp32. ``--size WxH`` draws another width and
height than the run's square (a run with ``data.aspect_buckets`` trained at its buckets' sizes).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bigtrain.config.diffusers_types import CLASSES as PLANNED
from bigtrain.errors import ConfigError

DEFAULT_STEPS = 28  # diffusers' FluxPipeline default


def add_image_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="picture.png", help="text-to-image: where the picture goes (picture.png)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"text-to-image: steps ({DEFAULT_STEPS})")
    parser.add_argument("--seed", type=int, default=0, help="text-to-image: the starting noise's seed (0)")
    parser.add_argument("--pipeline", help="text-to-image: the pipeline folder, where the run's recipe's has moved")
    parser.add_argument("--size", help="text-to-image: WIDTHxHEIGHT px (the run's data.image_size square)")


def picture_size(size: str | None, multiple: int) -> tuple[int, int] | None:
    """``--size`` as (width, height), each a multiple of what the pipeline's latents and patches tile."""
    if size is None:
        return None
    parts = size.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(f"--size {size}: give WIDTHxHEIGHT in px, e.g. 640x384")
    width, height = int(parts[0]), int(parts[1])
    if width % multiple or height % multiple:
        near = "x".join(str(max(multiple, round(v / multiple) * multiple)) for v in (width, height))
        raise ConfigError(f"--size {size}: the pipeline draws multiples of {multiple} px; try {near}")
    return width, height


def is_text_to_image(folder: str | Path) -> bool:
    """Whether a folder is a diffusers pipeline's or a text-to-image run's output_dir."""
    folder = Path(folder)
    return (folder / "model_index.json").is_file() or _recipe(folder).get("model", {}).get("task") == "text-to-image"


def _recipe(folder: Path) -> dict[str, Any]:
    import yaml

    from bigtrain.checkpoint.layout import RECIPE

    file = folder / RECIPE
    return (yaml.safe_load(file.read_text()) or {}) if file.is_file() else {}


def load_pipeline(folder: Path, pipeline: str | None) -> tuple[Any, dict[str, Any]]:
    """(the diffusers pipeline with the run's trained transformer or adapter, the run's recipe as a dict)."""
    import torch

    from bigtrain.config.diffusers_config import quiet_pipeline

    recipe = _recipe(folder)
    base = Path(pipeline or (folder if not recipe else recipe.get("model", {}).get("name_or_path") or ""))
    if not (base / "model_index.json").is_file():
        raise ConfigError(
            f"{folder}: its pipeline folder {str(base)!r} (the recipe's model.name_or_path) holds no model_index.json;"
            " give the pipeline the run trained from with --pipeline"
        )
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    import diffusers

    with quiet_pipeline():
        parts = {}
        if (folder / "model" / "config.json").is_file():  # trained fully: the pipeline's transformer replaced
            config = json.loads((folder / "model" / "config.json").read_text())
            cls = getattr(diffusers, config["_class_name"])
            parts["transformer"] = cls.from_pretrained(folder / "model", dtype=dtype)
        pipe = diffusers.DiffusionPipeline.from_pretrained(str(base), dtype=dtype, **parts)
        if not parts and (folder / "adapter").is_dir():
            pipe.load_lora_weights(str(folder / "adapter"))
    pipe.set_progress_bar_config(disable=True)
    return pipe.to("cuda" if torch.cuda.is_available() else "cpu"), recipe


def picture(
    pipe: Any, recipe: dict[str, Any], prompt: str, steps: int, seed: int, size: tuple[int, int] | None = None
) -> Any:
    """The pipeline's PIL picture for ``prompt`` at ``size`` (width, height), else the side the run trained with,
    and the text tokens it trained with (the pipeline's defaults for a pipeline folder); a prompt longer than those
    tokens is cut, and one line says so."""
    import sys

    import torch

    from bigtrain.config.diffusers_config import quiet_pipeline
    from bigtrain.data.encoded_images import t5_tokenizer
    from bigtrain.tasks.text_to_image import DEFAULT_IMAGE_SIZE, DEFAULT_TEXT_LEN

    data, train = recipe.get("data", {}), recipe.get("train", {})
    sizes: dict[str, Any] = {}
    if recipe:  # a run: the side and text tokens it trained with (its recipe's, else the task's defaults)
        side = data.get("image_size") or DEFAULT_IMAGE_SIZE
        sizes = {"height": side, "width": side}
        model_type = {v: k for k, v in PLANNED.items()}.get(type(pipe.transformer).__name__, "")
        sizes["max_sequence_length"] = data.get("seq_len") or DEFAULT_TEXT_LEN.get(model_type, 512)
        length = len(t5_tokenizer(pipe)(prompt).input_ids)
        if length > sizes["max_sequence_length"]:
            print(
                f"generate: --prompt is {length} tokens; cut to the {sizes['max_sequence_length']} the run trained "
                "with (data.seq_len)",
                file=sys.stderr,
            )
    if size is not None:
        sizes.update(width=size[0], height=size[1])
    guided = getattr(getattr(pipe, "transformer", None), "config", {}).get("guidance_embeds", False)
    if guided and train.get("guidance_scale") is not None:  # FLUX.1-dev's distilled guidance (SD3's is CFG's own)
        sizes["guidance_scale"] = train["guidance_scale"]
    generator = torch.Generator(pipe.device).manual_seed(seed)
    with torch.no_grad(), quiet_pipeline():  # diffusers' own note on the cut prompt: said above
        return pipe(prompt, num_inference_steps=steps, generator=generator, **sizes).images[0]


def run_image_command(args: argparse.Namespace) -> int:
    if args.prompt is None:
        raise ConfigError("a text-to-image model draws one --prompt: give --prompt")
    if args.steps < 1:
        raise ConfigError(f"--steps={args.steps} must be at least 1")
    if args.chat or args.image or args.sample:
        raise ConfigError("--chat, --image and --sample are for language models; drop them for a text-to-image one")
    out = Path(args.out)
    if out.suffix.lower() not in (".png", ".jpg", ".jpeg", ".webp"):
        raise ConfigError(f"--out {args.out}: name a picture file (.png, .jpg or .webp)")
    picture_size(args.size, 1)  # its form, before the pipeline loads
    pipe, recipe = load_pipeline(Path(args.folder), args.pipeline)
    size = picture_size(args.size, 2 * pipe.vae_scale_factor)  # FLUX packs 2 x 2 latents
    image = picture(pipe, recipe, args.prompt, args.steps, args.seed, size)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out)
    print(f"generate: wrote {out} ({image.width}x{image.height} px, {args.steps} steps, seed {args.seed})", flush=True)
    return 0
