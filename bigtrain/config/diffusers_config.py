"""A diffusers transformer's config as the rest of bigtrain reads a model's config (``model.task: text-to-image``).

bigtrain plans, builds, shards and checkpoints a model through its transformers ``PretrainedConfig``. A diffusion
transformer (``FluxTransformer2DModel``, ``SD3Transformer2DModel``) has a diffusers config instead: a ``config.json``
with ``_class_name`` and the class's init arguments, no ``model_type``. ``DiffusersTransformerConfig`` carries those
arguments as a ``PretrainedConfig`` of its own model type, with the width and depth the planner and the capability
table read (``hidden_size``: heads x head dim; ``num_hidden_layers``: every block), and says which diffusers class
it builds and how its weights are named. It lives in the config layer (the planner reads it and may not import the
model builders); diffusers itself is imported only to build a model.

A diffusers pipeline folder (``model_index.json``) names its transformer's sub-folder (``transformer/``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from bigtrain.config.diffusers_types import VAE_SCALE, is_diffusers_config, published_frozen_parts
from bigtrain.config.weight_files import tensor_entries
from bigtrain.errors import ConfigError

__all__ = ["VAE_SCALE", "is_diffusers_config"]  # read here by the builders and the planner

WEIGHTS_STEM = "diffusion_pytorch_model"  # diffusers' weights file: {stem}.safetensors, or shards and an index


class DiffusersTransformerConfig(PretrainedConfig):
    """A diffusers transformer's init arguments (``init``) as a ``PretrainedConfig`` (module docstring)."""

    model_type = "diffusers_transformer"
    class_name = ""  # the diffusers class
    weights_stem = WEIGHTS_STEM

    def __init__(
        self,
        init: dict[str, Any] | None = None,
        vae_scale: int = VAE_SCALE,
        frozen_parts: list[list[Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        self.init = dict(init or {})
        self.vae_scale = vae_scale  # pixels a side per latent: its pipeline's VAE's (the published ones': 8)
        # its pipeline's VAE and text encoders: [name, parameters, what it reads] each, a pipeline folder's own
        # (``frozen_parts``), else the published pipeline's (``diffusers_types.FROZEN``); None: none known
        self.frozen_parts = frozen_parts
        super().__init__(**kwargs)

    def latent_side(self, image_size: int) -> int:
        """The latents' side of an image of ``image_size`` px (what the planner's and the simulator's steps read)."""
        return image_size // self.vae_scale

    @property
    def hidden_size(self) -> int:
        return int(self.init["num_attention_heads"]) * int(self.init["attention_head_dim"])

    @property
    def num_attention_heads(self) -> int:
        return int(self.init["num_attention_heads"])

    @property
    def num_hidden_layers(self) -> int:
        return int(self.init.get("num_layers", 0)) + int(self.init.get("num_single_layers", 0))

    def diffusers_config(self) -> dict[str, Any]:
        """The config.json diffusers writes for the model (its class name and init arguments)."""
        return {"_class_name": self.class_name, **self.init}

    def save_pretrained(self, save_directory: str | Path, **kwargs: Any) -> None:
        """config.json as diffusers writes it, so that a checkpoint's and an export's folder load in diffusers
        (``from_pretrained``) as well as here (``read_folder``)."""
        folder = Path(save_directory)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.diffusers_config(), indent=2, sort_keys=True) + "\n")


class FluxTransformerConfig(DiffusersTransformerConfig):
    model_type = "flux_transformer"
    class_name = "FluxTransformer2DModel"


class SD3TransformerConfig(DiffusersTransformerConfig):
    model_type = "sd3_transformer"
    class_name = "SD3Transformer2DModel"


CONFIGS = {c.class_name: c for c in (FluxTransformerConfig, SD3TransformerConfig)}
BY_MODEL_TYPE = {c.model_type: c for c in CONFIGS.values()}


def from_dict(raw: dict[str, Any], key: str) -> DiffusersTransformerConfig:
    """A diffusers config.json's dict (``_class_name`` and init arguments), ``model.config``'s dict naming one of our
    model types with the class's init arguments beside it, or our own ``to_dict`` (``init`` whole)."""
    raw = dict(raw)
    name = raw.pop("_class_name", None)
    model_type = raw.pop("model_type", None)
    cls = CONFIGS.get(name) if name is not None else BY_MODEL_TYPE.get(model_type)
    if cls is None:
        known = ", ".join(CONFIGS)
        raise ConfigError(f"{key}: {name or model_type!r} is not a diffusion transformer bigtrain trains; use {known}")
    architectures = raw.pop("architectures", None)  # the class a task resolved it as (a preset names its own)
    # ours, read from a pipeline folder's VAE and text encoders
    vae_scale, parts = raw.pop("vae_scale", VAE_SCALE), raw.pop("frozen_parts", None)
    if isinstance(raw.get("init"), dict):  # our own to_dict / save_pretrained: the arguments kept whole
        init = raw["init"]
    else:
        init = {k: v for k, v in raw.items() if not k.startswith("_")}
    # without a pipeline folder's own: the published pipeline's for a transformer of its type and text widths
    parts = parts or published_frozen_parts(cls.model_type, init)
    return cls(init=init, vae_scale=vae_scale, frozen_parts=parts, architectures=architectures)


def read_folder(path: Path, key: str) -> DiffusersTransformerConfig:
    """The transformer's config of a diffusers pipeline folder (``model_index.json`` naming ``transformer``) or of a
    transformer's own folder (a ``config.json`` with ``_class_name``)."""
    index = path / "model_index.json"
    if index.is_file():
        pipeline = json.loads(index.read_text())
        if "transformer" not in pipeline:
            parts = sorted(k for k in pipeline if not k.startswith("_"))
            raise ConfigError(
                f"{key}: the pipeline {pipeline.get('_class_name', '?')} has no transformer ({', '.join(parts)}); "
                "bigtrain trains a diffusion transformer (FLUX, SD3)"
            )
        vae = path / "vae" / "config.json"
        blocks = json.loads(vae.read_text()).get("block_out_channels") if vae.is_file() else None
        path = path / "transformer"
    config = path / "config.json"
    if not config.is_file():
        raise ConfigError(f"{key}: {path} has no config.json; give a diffusers pipeline folder or its transformer/")
    raw = json.loads(config.read_text())
    if index.is_file() and blocks:  # the VAE halves the side at each block but the last
        raw["vae_scale"] = 2 ** (len(blocks) - 1)
    if index.is_file():
        raw["frozen_parts"] = frozen_parts(path.parent) or None
    return from_dict(raw, key)


FROZEN_FOLDERS = ("text_encoder", "text_encoder_2", "text_encoder_3", "vae")


def frozen_parts(pipeline: Path) -> list[list[Any]]:
    """The pipeline's VAE and text encoders: [folder, parameters, what it reads] each ("t5": the caption's tokens,
    "clip": CLIP's 77, "pixels": the VAE), the parameters counted from their safetensors files' headers
    (``weight_files.tensor_entries``)."""
    out: list[list[Any]] = []
    for name in FROZEN_FOLDERS:
        folder = pipeline / name
        if not (folder / "config.json").is_file():
            continue
        model_type = json.loads((folder / "config.json").read_text()).get("model_type", "")
        reads = "pixels" if name == "vae" else "t5" if model_type.startswith("t5") else "clip"
        # one variant's files: the plain ones (model.safetensors, or its shards) before any other (model.fp16...)
        variants: dict[str, list[Path]] = {}
        for file in sorted(folder.glob("*.safetensors")):
            variant = file.name.split(".")[1].split("-")[0] if file.name.count(".") == 2 else ""  # fp16-00001-of-2
            variants.setdefault(variant, []).append(file)
        files = variants.get("", next(iter(variants.values()), []))
        count = sum(math.prod(shape) for f in files for shape, _ in tensor_entries(f))
        if count:  # weights in .bin files only are not counted: the published pipeline's are taken instead
            out.append([name, count, reads])
    return out


@contextmanager
def quiet_pipeline() -> Iterator[None]:
    """Loading a diffusers pipeline (or its LoRA saver) without what transformers and diffusers print that a user
    can do nothing about: the image processors a pipeline module imports falling back to PIL, the loading bars, the
    text encoders' notes on cut captions (the data's own line counts them)."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as hf_logging

    levels = [(library, library.get_verbosity()) for library in (diffusers_logging, hf_logging)]
    for library, _ in levels:
        library.set_verbosity_error()
        library.disable_progress_bar()
    try:
        yield
    finally:
        for library, level in levels:
            library.set_verbosity(level)
            library.enable_progress_bar()


def diffusers_class(cfg: DiffusersTransformerConfig) -> Any:
    """The diffusers class the config builds (diffusers imported here only: planning a preset needs none)."""
    try:
        import diffusers
    except ImportError as e:
        raise ConfigError(
            f"model.task=text-to-image trains a diffusers model ({cfg.class_name}): pip install 'bigtrain[diffusion]'"
        ) from e
    return getattr(diffusers, cfg.class_name)


def construct(cfg: DiffusersTransformerConfig, dtype: Any = None) -> Any:
    """The model of the config, its parameters in ``dtype`` (fp32 by default), built as diffusers builds it (its
    class's ``from_config``) on the device the caller opened (``meta`` for a build whose values come later)."""
    import torch

    model = diffusers_class(cfg).from_config(cfg.diffusers_config())
    # torch's own cast: diffusers' ``to`` warns of modules to keep in fp32 even when it lists none
    return torch.nn.Module.to(model, dtype or torch.float32)


def denoise_inputs(cfg: DiffusersTransformerConfig, b: int, latent_side: int, text_len: int, device: Any = None):
    """A diffusion transformer's inputs for ``b`` images of ``latent_side`` latents a side and ``text_len`` text
    tokens (values aside: the planner's fake step and the simulator's), and a target of the prediction's shape: FLUX's
    latents packed 2 x 2 into tokens with their position ids, SD3's as the VAE gives them (it patches them itself)."""
    import torch

    init = cfg.init
    out_channels = init.get("out_channels") or init["in_channels"]
    text = {
        "encoder_hidden_states": torch.randn(b, text_len, init["joint_attention_dim"], device=device),
        "pooled_projections": torch.randn(b, init["pooled_projection_dim"], device=device),
        "timestep": torch.rand(b, device=device),
    }
    if cfg.model_type == SD3TransformerConfig.model_type:
        latents = torch.randn(b, init["in_channels"], latent_side, latent_side, device=device)
        return {"hidden_states": latents, **text}, torch.randn(b, out_channels, latent_side, latent_side, device=device)
    patches = (latent_side // 2) ** 2
    inputs = {
        "hidden_states": torch.randn(b, patches, init["in_channels"], device=device),
        **text,
        "img_ids": torch.zeros(patches, 3, device=device),
        "txt_ids": torch.zeros(text_len, 3, device=device),
    }
    if init.get("guidance_embeds"):
        inputs["guidance"] = torch.full((b,), 3.5, device=device)
    return inputs, torch.randn(b, patches, out_channels, device=device)


def diffusers_folder(path: Path) -> bool:
    """Whether a model folder is a diffusers pipeline's (``model_index.json``) or a diffusers model's (a config.json
    naming its ``_class_name``)."""
    if (path / "model_index.json").is_file():
        return True
    try:
        return "_class_name" in json.loads((path / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def weights_folder(path: Path) -> Path:
    """Where a folder's transformer weights lie: ``transformer/`` of a pipeline folder, else the folder itself."""
    return path / "transformer" if (path / "model_index.json").is_file() else path
