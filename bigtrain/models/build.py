"""Build a HuggingFace model on the ``meta`` device: structure and shapes, no memory.

The trainer shards this skeleton first and materialises it afterwards (``materialize.py``), so no rank ever allocates
the full model unless the plan replicates it (DDP).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bigtrain.config.diffusers_config import DiffusersTransformerConfig, diffusers_folder, read_folder
from bigtrain.config.hf import attention_choices, causal_lm_class, config_object, model_class, resolve_attention
from bigtrain.config.schema import ModelConfig
from bigtrain.errors import ConfigError


def load_hf_config(cfg: ModelConfig) -> Any:
    """The ``PretrainedConfig`` of the recipe's model, from a local folder or from ``model.config`` (what its task
    makes of it is the job's: ``bigtrain/job.py``)."""

    if (cfg.name_or_path is None) == (cfg.config is None):
        raise ConfigError("set exactly one of model.name_or_path (a local HF folder) or model.config (a config dict)")
    if cfg.name_or_path is not None:
        path = Path(cfg.name_or_path)
        key = f"model.name_or_path={cfg.name_or_path!r}"
        if diffusers_folder(path):  # a diffusers pipeline or transformer folder (model.task: text-to-image)
            return read_folder(path, key)
        if not (path / "config.json").is_file():
            todo = "save one with model.save_pretrained(PATH) or use model.config"
            if path.name == "model":  # where a run writes its final model: a step of a walk-through not run yet
                todo = (
                    f"a run writes its final model to output_dir/model: first train the recipe whose output_dir is "
                    f"{str(path.parent)!r} (or save a model there with model.save_pretrained(PATH))"
                )
            raise ConfigError(
                f"model.name_or_path={cfg.name_or_path!r} is not a local HF model folder (no config.json); {todo}"
            )
        config = _read_config(path, key, cfg.trust_remote_code)
    else:
        key = "model.config"
        config = config_object(cfg.config or {}, key, causal_lm=False)
    return config


def read_saved_config(folder: Path) -> Any:
    """The config of a folder bigtrain wrote (a checkpoint's hf/ files): diffusers' or transformers'."""
    if diffusers_folder(folder):
        return read_folder(folder, str(folder))
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder, local_files_only=True)


def config_key(cfg: ModelConfig) -> str:
    """How a message names where the model's config came from."""
    return "model.config" if cfg.name_or_path is None else f"model.name_or_path={cfg.name_or_path!r}"


def _read_config(path: Path, key: str, trust_remote_code: bool) -> Any:
    """The folder's config through transformers, after what transformers would only show as a traceback (a
    config.json that is not JSON) or ask on every rank's terminal (run the folder's own code?) is said in one line."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    try:
        raw = json.loads((path / "config.json").read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{key}: {path / 'config.json'} is not valid JSON ({e}); fix or re-save the file") from e
    own_code = isinstance(raw, dict) and "auto_map" in raw and raw.get("model_type") not in CONFIG_MAPPING_NAMES
    if own_code and not trust_remote_code:
        raise ConfigError(
            f"{key}: the model's config names its own Python code (auto_map, model_type "
            f"{raw.get('model_type')!r}), which transformers does not ship; bigtrain runs no code from a model "
            "folder unless model.trust_remote_code=true, and trains only the families transformers ships"
        )
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except (ValueError, OSError, KeyError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{key}: transformers cannot read its config: {first}") from e
    if own_code:
        raise ConfigError(
            f"{key}: model_type {config.model_type!r} is the folder's own code (auto_map), not a family transformers "
            "ships; bigtrain plans, shards and checkpoints models by the classes transformers ships: use one of those"
        )
    return config


def construct(hf_config: Any, **kwargs: Any) -> nn.Module:
    """The model of the config's class (``model_class``), else its family's causal LM, built from the config (as the
    Auto classes build it: a class of a composite config's language model takes that text config)."""
    import transformers

    if isinstance(hf_config, DiffusersTransformerConfig):
        from bigtrain.config.diffusers_config import construct as construct_diffusers

        return construct_diffusers(hf_config, kwargs.get("dtype"))
    cls = model_class(hf_config)
    if cls is None:
        return transformers.AutoModelForCausalLM.from_config(hf_config, **kwargs)
    text_config = getattr(hf_config, "sub_configs", {}).get("text_config")
    if text_config is not None and getattr(cls, "config_class", None) is text_config:
        hf_config = hf_config.get_text_config()
    return cls._from_config(hf_config, **kwargs)


def set_cache(hf_config: Any, on: bool) -> None:
    """The KV cache on or off, in the config and in its language model's (a vision-language model's decoder reads
    its own text config: a cache left on there makes a recomputed block attend to its first forward's keys too)."""
    hf_config.use_cache = on
    text = hf_config.get_text_config()
    if text is not hf_config:
        text.use_cache = on


def build_meta_model(hf_config: Any, attn_implementation: str) -> nn.Module:
    """An fp32 model of the config's task (a causal LM, an image or a sequence classifier) whose parameters and
    buffers live on ``meta``."""
    set_cache(hf_config, False)  # training: no KV cache
    attn_implementation = resolve_attention(hf_config, attn_implementation)
    try:
        with torch.device("meta"):
            model = construct(hf_config, dtype=torch.float32, attn_implementation=attn_implementation)
    except (ValueError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        first = first.split(". ")[0]  # transformers' first sentence says it; the rest is advice for its own API
        if attn_implementation not in ("sdpa", "eager") or "attn" in str(e).lower() or "attention" in str(e).lower():
            works = " or ".join(attention_choices(hf_config))
            raise ConfigError(
                f"model.attn_implementation={attn_implementation!r} cannot build {hf_config.model_type} ({first}); "
                f"for {hf_config.model_type} use {works} (or auto, the family's own default)"
            ) from e
        named = model_class(hf_config)
        raise ConfigError(
            f"model config of type {hf_config.model_type!r} does not build as "
            f"{named.__name__ if named else 'a causal LM'} ({first})"
        ) from e
    return model


def init_deepspeed_comm() -> None:
    """DeepSpeed's communication layer over the process group the runtime already started. The first call builds
    its CPU shared-memory op and prints ``... built successfully`` to stdout from every rank: kept off the terminal,
    anything else it prints passes through."""
    import deepspeed
    import torch.distributed as dist

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        deepspeed.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False)
    rest = [line for line in printed.getvalue().splitlines() if not line.endswith(" built successfully")]
    if rest:
        print("\n".join(rest))


def build_partitioned_model(hf_config: Any, attn_implementation: str, deepspeed_config: dict[str, Any]) -> nn.Module:
    """DeepSpeed ZeRO-3: the model constructed under ``deepspeed.zero.Init``, each parameter partitioned over the
    ranks as its module is built (DeepSpeed cannot take a meta model); its values are written afterwards."""
    import deepspeed

    init_deepspeed_comm()  # zero.Init reads it
    set_cache(hf_config, False)
    # zero.Init replaces torch's tensor constructors while it is open; torch._dynamo, if first imported inside it (a
    # model's code may import it), then fails to register its polyfills against them ("Signature mismatch")
    import torch._dynamo  # noqa: F401

    # dtype from the config (fp32 unless bf16/fp16 is enabled): DeepSpeed 0.19.8 ignores an explicit dtype= on an
    # accelerator without fp16 support (the CPU) and partitions in bf16 (an operator-precedence slip in
    # Init._set_dtype), which rounds every weight
    # HF's initialisation is skipped: the values are written afterwards (load_values), and some families' init reads
    # shapes a partitioned parameter no longer has (ResNet's fan-in of a convolution)
    from transformers.initialization import no_init_weights

    with deepspeed.zero.Init(config_dict_or_path=deepspeed_config):
        with no_init_weights():
            model = construct(
                hf_config, dtype=torch.float32, attn_implementation=resolve_attention(hf_config, attn_implementation)
            )
        if hasattr(model, "tie_weights"):  # a diffusers model has no tied weights
            model.tie_weights()  # skipped with the initialisation: the tied LM head is the embeddings' parameter again
    return model


def model_shapes(hf_config: Any, attn_implementation: str) -> dict[str, tuple[int, ...]]:
    """Every entry of the whole model's state dict (parameters and persistent buffers) by name and shape."""
    return {name: tuple(t.shape) for name, t in build_meta_model(hf_config, attn_implementation).state_dict().items()}


def block_class_names(hf_config: Any) -> list[str]:
    """The class names of the model's repeated blocks: what accelerate's and HF Trainer's FSDP plugins wrap
    (``transformer_layer_cls_to_wrap``). Its ``_no_split_modules``, read from the model class alone; for a model
    that lists none (BERT's classifiers), the blocks bigtrain itself shards, found on a model built on ``meta``."""
    from bigtrain.config.hf import decoder_blocks

    if isinstance(hf_config, DiffusersTransformerConfig):  # a diffusion transformer: its diffusers class's blocks
        from bigtrain.config.diffusers_config import diffusers_class

        return list(diffusers_class(hf_config)._no_split_modules)
    cls = model_class(hf_config) or causal_lm_class(hf_config)
    if cls is None:
        raise ConfigError(f"model config of type {hf_config.model_type!r} has no model class in transformers")
    names = list(getattr(cls, "_no_split_modules", None) or [])
    if not names:
        model = build_meta_model(hf_config, "auto")
        names = sorted({type(block).__name__ for _, _, block in decoder_blocks(model)})
    return names
