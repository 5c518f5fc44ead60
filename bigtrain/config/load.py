"""Recipe loading: YAML file + ``--set a.b=v`` overrides -> a typed, validated :class:`RecipeConfig`.

Every problem is a :class:`ConfigError` naming the dotted key, so the same bad recipe fails identically on every rank.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from bigtrain.config.schema import RecipeConfig, recipe_key
from bigtrain.errors import ConfigError


def load_recipe(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RecipeConfig:
    """Read a YAML recipe (or start from defaults when ``path`` is None) and apply ``key.sub=value`` overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"recipe {str(p)!r} does not exist; pass a YAML file such as recipes/quickstart.yaml")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"recipe {str(p)!r} is not valid YAML: {yaml_problem(e)}") from e
        except UnicodeDecodeError as e:
            raise ConfigError(f"recipe {str(p)!r} is not UTF-8 text (byte {e.start}); save it as UTF-8") from e
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"recipe {str(p)!r} must be a mapping of sections (model, data, train, parallel)")
        raw = loaded
    for item in overrides:
        apply_override(raw, item)
    cfg = build_dataclass(RecipeConfig, raw, prefix="")
    check_ranges(cfg)
    return with_model_tokenizer(cfg)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def has_tokenizer(folder: str | Path) -> bool:
    """Whether ``folder`` holds the files of a saved HF tokenizer."""
    return any((Path(folder) / name).is_file() for name in TOKENIZER_FILES)


def with_model_tokenizer(cfg: RecipeConfig) -> RecipeConfig:
    """Text data with ``data.tokenizer`` unset is tokenised by the model folder's own tokenizer when the folder ships
    one (a model trained on another tokenizer's ids learns nothing useful, and nothing else would notice: byte ids
    fit any vocabulary); the built-in byte tokenizer is for ``model.config`` models and folders without one."""
    folder = cfg.model.name_or_path
    if cfg.data.tokenizer is not None or folder is None or cfg.data.path.endswith(".npy"):
        return cfg
    if has_tokenizer(folder):
        return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=folder))
    return cfg


# dotted key -> smallest allowed value
MINIMUMS: dict[str, float] = {
    "train.steps": 1,
    "train.global_batch_size": 1,
    "train.warmup_steps": 0,
    "train.eval_every": 0,
    "data.eval_fraction": 0.0,
    "data.workers": 0,
    "train.label_smoothing": 0.0,
    "train.lr": 0.0,
    "train.weight_decay": 0.0,
    "train.grad_clip": 0.0,
    "train.collective_timeout_s": 1,
    "train.fp16_initial_scale": 1.0,
    "train.min_lr_ratio": 0.0,
    "train.beta": 0.0,
    "train.simpo_gamma": 0.0,
    "train.num_iterations": 1,
    "train.max_completion_length": 1,
    "train.top_k": 0,
    "train.epsilon": 0.0,
    "train.epsilon_high": 0.0,
    "data.max_prompt_length": 1,
    "lora.r": 1,
    "lora.dropout": 0.0,
    "parallel.micro_batch_size": 1,
    "parallel.tp": 1,
    "parallel.pp": 1,
    "checkpoint.every": 0,
    "checkpoint.keep": 1,
    "checkpoint.mtbf_hours": 0.001,
    "checkpoint.gpu_mtbf_hours": 0.001,
}


def yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's complaint with the line and column it found it at (1-based, as editors count)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def check_ranges(cfg: RecipeConfig) -> None:
    """Numbers that parse but cannot work (0 steps, negative warmup, NaN) fail here with the key's name."""
    for section in ("train", "data", "parallel", "checkpoint", "lora", "rollout"):
        for f in dataclasses.fields(getattr(cfg, section)):
            value = getattr(getattr(cfg, section), f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{section}.{recipe_key(f)}={value} must be a finite number")
    for key in MINIMUMS:
        section, name = key.split(".")
        check_minimum(key, getattr(getattr(cfg, section), name))
    if cfg.train.min_lr_ratio > 1:
        raise ConfigError(f"train.min_lr_ratio={cfg.train.min_lr_ratio} must be between 0 and 1")
    for key, typical in (("adam_beta1", 0.9), ("adam_beta2", 0.95)):
        if not 0 <= getattr(cfg.train, key) < 1:
            raise ConfigError(f"train.{key}={getattr(cfg.train, key)} must be in [0, 1); e.g. {typical}")
    if cfg.data.eval_fraction >= 1:
        raise ConfigError(
            f"data.eval_fraction={cfg.data.eval_fraction} must be below 1 (e.g. 0.05); rows must be left to train on"
        )
    if cfg.data.eval_fraction > 0 and cfg.data.eval_path is not None:
        raise ConfigError("set data.eval_path or data.eval_fraction, not both")
    if cfg.train.label_smoothing > 1:
        raise ConfigError(f"train.label_smoothing={cfg.train.label_smoothing} must be between 0 and 1 (e.g. 0.1)")
    if cfg.lora.dropout >= 1:
        raise ConfigError(f"lora.dropout={cfg.lora.dropout} must be below 1 (e.g. 0.05)")
    if cfg.lora.target_modules == []:
        raise ConfigError("lora.target_modules is empty; unset it (every linear of the decoder blocks) or name some")
    if cfg.lora.modules_to_save == []:
        raise ConfigError("lora.modules_to_save is empty; unset it (only the adapters train) or name modules")
    if cfg.train.lr == 0:
        raise ConfigError("train.lr=0 would leave the model as it is; use a learning rate such as 1e-4")
    if cfg.checkpoint.resume is True:  # `resume: true` reads naturally as "resume if you can"
        cfg.checkpoint.resume = "auto"
    if cfg.checkpoint.resume == "":
        raise ConfigError("checkpoint.resume is empty; use auto, false, or the path of a checkpoint folder")


def recipe_warnings(cfg: RecipeConfig) -> list[str]:
    """What runs but is probably not what was meant (logged at start-up, rank 0)."""
    out = []
    if cfg.train.warmup_steps >= cfg.train.steps:
        out.append(
            f"train.warmup_steps={cfg.train.warmup_steps} is not shorter than the run (train.steps="
            f"{cfg.train.steps}): the learning rate never reaches train.lr={cfg.train.lr:g}"
        )
    return out


def check_minimum(key: str, value: Any, shown: str | None = None) -> None:
    """Raise if the dotted recipe ``key`` has a known minimum and ``value`` is below it; ``shown`` names the key
    as the user wrote it (e.g. ``--fix tp``)."""
    minimum = MINIMUMS.get(key)
    if minimum is not None and isinstance(value, (int, float)) and value < minimum:  # (not auto)
        raise ConfigError(f"{shown or key}={value} must be at least {minimum}")


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Set ``a.b.c=value`` in a nested dict; the value is parsed as YAML (so 2 is an int, true a bool)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r} must look like key.sub=value, e.g. train.steps=20")
    key, _, text = item.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {item!r} has an empty key part; write e.g. parallel.dp_shard=2")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {item!r}: the value is not valid YAML ({yaml_problem(e)}); quote it") from e
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def build_dataclass(cls: type, raw: Any, prefix: str) -> Any:
    """Build dataclass ``cls`` from a dict, checking keys and value types; ``prefix`` is the dotted path for errors."""
    where = prefix.rstrip(".") or "recipe"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(raw).__name__} {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {recipe_key(f): f for f in dataclasses.fields(cls) if not f.metadata.get("record_options")}
    collected = next((f for f in dataclasses.fields(cls) if f.metadata.get("record_options")), None)
    # the keys capability records bring (Capability.options), collected in the field that holds them
    options = _record_options() if collected is not None else {}
    brought = {k: record_option_value(k, v, prefix) for k, v in raw.items() if k not in fields and k in options}
    unknown = [k for k in raw if k not in fields and k not in brought]
    if unknown:
        key = unknown[0]
        known = [*fields, *options]
        close = difflib.get_close_matches(str(key), known, n=1)
        hint = f"did you mean {prefix}{close[0]}?" if close else f"known keys: {', '.join(known)}"
        raise ConfigError(f"unknown recipe key {prefix}{key}; {hint}")
    kwargs = {}
    for key, value in raw.items():
        if key in brought:
            continue
        name = fields[key].name
        kwargs[name] = coerce(value, hints[name], f"{prefix}{key}")
    if brought:
        kwargs[collected.name] = brought
    return cls(**kwargs)


def _record_options() -> dict[str, Any]:
    """``capabilities.OPTIONS``, imported when first needed: the records import the schema, not the loader."""
    from bigtrain.config.capabilities import OPTIONS

    return OPTIONS


def record_option_value(key: str, value: Any, prefix: str = "parallel.") -> Any:
    """A record option's value checked against its default's type (a whole number may stand for a float)."""
    default = _record_options()[key].default
    number_for_float = isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)
    if not number_for_float and (
        isinstance(default, bool) != isinstance(value, bool) or not isinstance(value, type(default))
    ):
        raise ConfigError(
            f"{prefix}{key} must be a {type(default).__name__} like its default {default!r}, got {value!r}"
        )
    return type(default)(value)


def coerce(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against a type hint, converting only where YAML is ambiguous (1 for a float, '3e-4')."""
    if dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value, prefix=f"{key}.")
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        errors = []
        for option in non_none:
            try:
                return coerce(value, option, key)
            except ConfigError as e:
                errors.append(e)
        raise errors[-1]
    if origin is Literal:
        if value not in args:
            choices = ", ".join(str(a) for a in args)
            raise ConfigError(f"{key}={value!r} is not allowed; use one of: {choices}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} must be true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} must be an integer")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 3e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}={value!r} must be a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}={value!r} must be a string")
    if origin is list:
        if isinstance(value, str):  # --set lora.target_modules=q_proj,v_proj
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list):
            return [coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
        raise ConfigError(f"{key} must be a list, got {value!r}")
    if origin is dict or hint is dict:
        if isinstance(value, dict):
            return value
        raise ConfigError(f"{key} must be a mapping, got {value!r}")
    raise TypeError(f"schema type {hint!r} of {key} is not handled")  # a bug in schema.py, not user input


def dump_recipe(cfg: RecipeConfig) -> str:
    """The recipe as YAML that ``load_recipe`` reads back as the same config (what runs and checkpoints record)."""
    return yaml.safe_dump(recipe_to_dict(cfg), sort_keys=False)


def recipe_to_dict(cfg: Any) -> dict[str, Any]:
    """The recipe as plain data under its YAML key names: what ``build_dataclass`` reads back."""
    if not dataclasses.is_dataclass(cfg):
        return cfg
    out = {}
    for f in dataclasses.fields(cfg):
        if f.metadata.get("record_options"):
            out.update(getattr(cfg, f.name))  # the records' keys, flat among the section's own
        else:
            out[recipe_key(f)] = recipe_to_dict(getattr(cfg, f.name))
    return out
