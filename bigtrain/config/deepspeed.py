"""The DeepSpeed JSON of a plan: a template from ``deepspeed_configs/`` (or the user's own file) with every ``"auto"``
filled from the recipe and the plan, and nothing in it that contradicts them.

The template is chosen by ZeRO stage and offload: ``zero1``, ``zero2``, ``zero3``, ``zero2-offload``,
``zero3-offload`` (and ``zero0`` for exported ddp plans). The values bigtrain decides (``decided``) are the batch
shape, clipping, precision, ZeRO stage and offload devices; the bucket sizes follow the hidden size h as HF's
DeepSpeed integration sets them (reduce bucket h², ZeRO-3 prefetch bucket 0.9·h², parameter persistence threshold
10·h). A value the JSON states itself is kept when it agrees and is an error when it does not
("gradient_accumulation_steps=8 in the DeepSpeed config, but the recipe and plan give 4"): silently overriding
either side would train something other than what one of them says.
The optimizer and the schedule are the recipe's (AdamW, warmup + cosine), passed to ``deepspeed.initialize`` as
objects, so a JSON ``optimizer`` or ``scheduler`` section is refused too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.errors import ConfigError

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "deepspeed_configs"
# zero0 (DeepSpeed data parallelism without ZeRO) is what a ddp plan exports to (bigtrain export --to deepspeed)
TEMPLATES = ("zero0", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload")


def template_name(plan: Plan) -> str:
    offload = (plan.offload_optimizer or plan.offload_params) and plan.zero_stage > 1
    return f"zero{plan.zero_stage}" + ("-offload" if offload else "")  # (zero1 gets its offload section filled in)


def decided(cfg: RecipeConfig, plan: Plan) -> dict[str, Any]:
    """The values bigtrain decides, by dotted key path in the DeepSpeed JSON."""
    train = cfg.train
    values: dict[str, Any] = {
        "train_batch_size": train.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum_steps(train.global_batch_size),
        "gradient_clipping": train.grad_clip,
        "bf16.enabled": train.mixed_precision == "bf16",
        "fp16.enabled": train.mixed_precision == "fp16",
        "zero_optimization.stage": plan.zero_stage,
        "zero_optimization.offload_optimizer.device": "cpu" if plan.offload_optimizer else "none",
        "zero_optimization.offload_param.device": "cpu" if plan.offload_params else "none",
    }
    if train.mixed_precision == "fp16":
        values["fp16.initial_scale_power"] = round(math.log2(train.fp16_initial_scale))
    return values


def _derived(hidden_size: int) -> dict[str, Any]:
    """Values filled only where the JSON says "auto" (tuning, not semantics: a stated value is kept)."""
    h2 = hidden_size * hidden_size
    return {
        "zero_optimization.reduce_bucket_size": h2,
        "zero_optimization.allgather_bucket_size": h2,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * h2),
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden_size,
        "fp16.initial_scale_power": 16,
    }


def _get(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def _autos(tree: Any, prefix: str = "") -> list[str]:
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in _autos(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")] if tree == "auto" else []


def _same(stated: Any, wanted: Any) -> bool:
    if isinstance(wanted, bool) or isinstance(stated, bool):
        return bool(stated) == wanted
    if isinstance(wanted, float) or isinstance(stated, float):
        return isinstance(stated, int | float) and math.isclose(float(stated), float(wanted))
    return stated == wanted


def load_source(cfg: RecipeConfig, plan: Plan) -> tuple[dict[str, Any], str]:
    """The JSON to fill and what to call it in messages."""
    path = cfg.parallel.deepspeed_config
    source = Path(path) if path else TEMPLATES_DIR / f"{template_name(plan)}.json"
    name = f"parallel.deepspeed_config={path!r}" if path else f"deepspeed_configs/{source.name}"
    if not source.is_file():
        raise ConfigError(f"{name} does not exist (a DeepSpeed JSON file)")
    try:
        tree = json.loads(source.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{name} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from e
    if not isinstance(tree, dict):
        raise ConfigError(f"{name} must hold a JSON object")
    return tree, name


def bucket_width(hf_config: Any) -> int:
    """The model's width, which sizes DeepSpeed's "auto" buckets (HF's own rule): its hidden size, a
    vision-language model's language model's, a CNN's widest stage."""
    text = getattr(hf_config, "text_config", None)
    width = getattr(hf_config, "hidden_size", None) or getattr(text, "hidden_size", None)
    return int(width or max(getattr(hf_config, "hidden_sizes", None) or [1024]))


def deepspeed_config(cfg: RecipeConfig, plan: Plan, hidden_size: int) -> dict[str, Any]:
    """The complete DeepSpeed config for ``plan`` under ``cfg``: no "auto" left, nothing contradicting them."""
    tree, name = load_source(cfg, plan)
    for section in ("optimizer", "scheduler"):
        if section in tree:
            raise ConfigError(
                f'{name} has a "{section}" section, but the optimizer and the schedule come from the recipe '
                "(train.lr, warmup_steps, lr_schedule, weight_decay, adam_*): remove the section"
            )
    if cfg.train.mixed_precision == "fp16":
        _require_whole_power_of_two(cfg.train.fp16_initial_scale)
    for path, wanted in decided(cfg, plan).items():
        stated = _get(tree, path)
        if stated is None:
            if path.endswith("offload_optimizer.device") or path.endswith("offload_param.device"):
                if wanted == "none":
                    continue  # no offload section: nothing offloaded, as the plan wants
            _set(tree, path, wanted)
        elif stated == "auto":
            _set(tree, path, wanted)
        elif not _same(stated, wanted):
            raise ConfigError(
                f"{path}={json.dumps(stated)} in {name}, but the recipe and plan give {json.dumps(wanted)} "
                f'({_whence(path)}); set it to "auto" or to the same value'
            )
    for path, value in _derived(hidden_size).items():
        if _get(tree, path) == "auto":
            _set(tree, path, value)
    left = _autos(tree)
    if left:
        raise ConfigError(f'{name} has "auto" values bigtrain does not fill: {", ".join(left)}; give them values')
    return tree


def _require_whole_power_of_two(scale: float) -> None:
    if scale <= 0 or 2 ** round(math.log2(scale)) != scale:
        raise ConfigError(
            f"train.fp16_initial_scale={scale}: DeepSpeed starts its loss scale at a power of two "
            "(initial_scale_power); use e.g. 65536"
        )


def _whence(path: str) -> str:
    return {
        "train_batch_size": "train.global_batch_size",
        "train_micro_batch_size_per_gpu": "parallel.micro_batch_size",
        "gradient_accumulation_steps": "train.global_batch_size / (micro_batch_size x data-parallel ranks)",
        "gradient_clipping": "train.grad_clip",
        "bf16.enabled": "train.mixed_precision",
        "fp16.enabled": "train.mixed_precision",
        "fp16.initial_scale_power": "train.fp16_initial_scale",
        "zero_optimization.stage": "parallel.zero_stage",
        "zero_optimization.offload_optimizer.device": "parallel.offload_optimizer",
        "zero_optimization.offload_param.device": "parallel.offload_params",
    }[path]
