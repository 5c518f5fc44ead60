"""``bigtrain export RECIPE --to accelerate|deepspeed|hf-trainer -o FILE``: the recipe's plan, written for another
tool.

The plan is the one ``bigtrain train`` would run: a manual plan resolved for ``--gpus`` ranks (or for the product of
its degrees when the recipe states them all), ``plan: auto`` chosen by the planner for ``--gpus`` of ``--gpu`` /
``--gpu-memory`` (or the GPUs detected here). Notes about the translation go to stderr; the file is written only
when the whole export succeeded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bigtrain.config.capabilities import ModelFacts, Setup, check
from bigtrain.config.load import load_recipe
from bigtrain.config.plan import Plan
from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import ADAPTER_METHODS, RecipeConfig
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.integrations import TARGETS, Export, dropped_memory_options

log = logging.getLogger("bigtrain")


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="YAML recipe, e.g. recipes/quickstart.yaml")
    parser.add_argument("--to", required=True, choices=TARGETS, help="the tool the file is for")
    parser.add_argument("-o", "--output", required=True, help="the file to write (YAML for accelerate, else JSON)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a recipe key"
    )
    parser.add_argument("--gpus", type=int, help="GPUs of the job (default: the plan's degrees, or detected)")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs per machine (default: min(gpus, 8))")
    parser.add_argument("--gpu", help="plan: auto: GPU type, e.g. H100, A100-40GB (default: detected, else H100)")
    parser.add_argument("--gpu-memory", help="plan: auto: memory per GPU, e.g. 80GB; overrides the GPU table")
    parser.add_argument(
        "--hardware-profile", metavar="FILE", help="plan: auto: a bigtrain probe profile instead of the GPU table"
    )


def _stated_world(cfg: RecipeConfig) -> int | None:
    """The world size a manual plan states by itself (every degree given), else None."""
    p = cfg.parallel
    if p.backend == "ddp":
        return None if p.dp_replicate in (None, -1) else p.dp_replicate * p.tp * p.pp * p.cp
    if p.dp_shard in (None, -1):
        return None
    replicate = 1 if p.dp_replicate in (None, -1) else p.dp_replicate
    return replicate * p.dp_shard * p.tp * p.pp * p.cp


def _auto_plan(cfg: RecipeConfig, args: argparse.Namespace) -> Plan:
    from bigtrain.cli.plan import cluster_from_args, default_seq_len
    from bigtrain.planner.model_stats import ModelStats, load_model_config
    from bigtrain.planner.search import search

    cluster = cluster_from_args(
        args,
        "parallel.plan=auto is planned for the GPUs it will run on: no GPU detected here, give --gpus N and "
        "--gpu NAME or --gpu-memory SIZE",
        profile=args.hardware_profile or cfg.parallel.hardware_profile,
    )
    gpus = cluster.num_gpus
    model_config = load_model_config(cfg.model.config or cfg.model.name_or_path or "")
    seq_len = cfg.data.seq_len or default_seq_len(model_config)
    stats = ModelStats.from_config(model_config)
    best = search(stats, cluster, Workload.of_train(cfg.train, seq_len, cfg.lora))[0]
    if not (best.fits and best.runnable):
        raise ConfigError(
            f"parallel.plan=auto found no plan that fits {gpus} x {cluster.gpu.name} "
            f"({cluster.gpu.memory_bytes / 2**30:.0f} GiB): best was '{best.rejected_because}'; "
            "run bigtrain plan on the recipe for what would fit"
        )
    return best.plan


def export_plan(cfg: RecipeConfig, args: argparse.Namespace) -> tuple[Plan, Export]:
    """The plan and what the target makes of it."""
    from bigtrain.integrations.accelerate_config import export_accelerate
    from bigtrain.integrations.deepspeed_json import export_deepspeed
    from bigtrain.integrations.hf_trainer import export_hf_trainer
    from bigtrain.models.build import block_class_names, load_hf_config

    if args.gpus is not None and args.gpus < 1:
        raise ConfigError(f"--gpus {args.gpus} must be at least 1")
    if cfg.parallel.plan == "auto":
        plan = _auto_plan(cfg, args)
    else:
        world = args.gpus or _stated_world(cfg)
        if world is None:
            raise ConfigError(
                "the recipe's plan fills the world with parallel.dp_shard (or dp_replicate for ddp): give the job's "
                "size with --gpus N"
            )
        plan = resolve_plan(cfg.parallel, world, cfg.train)
    hf_config = load_hf_config(cfg.model)
    check(Setup(plan, cfg.train, ModelFacts.of(hf_config)))  # the rows that read the model, as start-up asks them
    per_node = args.gpus_per_node or min(plan.world_size, 8)
    if per_node < 1:
        raise ConfigError(f"--gpus-per-node {per_node} must be at least 1")
    if args.to == "accelerate":
        export = export_accelerate(cfg, plan, block_class_names(hf_config), per_node)
    elif args.to == "deepspeed":
        export = export_deepspeed(cfg, plan, hf_config)
    else:
        export = export_hf_trainer(cfg, plan, hf_config, block_class_names(hf_config))
    export.notes += dropped_memory_options(plan, args.to)
    if cfg.train.method in ADAPTER_METHODS:
        lora = cfg.lora
        export.notes.append(
            f"train.method={cfg.train.method}: the adapters are not part of a {args.to} config; wrap the model with "
            f"peft in your script (LoraConfig(r={lora.r}, lora_alpha={lora.alpha:g}, lora_dropout={lora.dropout:g}, "
            f"target_modules={lora.target_modules or 'all-linear'!r}"
            + (f", modules_to_save={lora.modules_to_save!r}" if lora.modules_to_save else "")
            + ")"
            + (", the base loaded 4-bit NF4" if cfg.train.method == "qlora" else "")
            + "); this file carries the parallel plan"
        )
    return plan, export


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def run_export_command(args: argparse.Namespace) -> int:
    from bigtrain.integrations.accelerate_config import to_yaml

    cfg = load_recipe(args.recipe, args.overrides)
    plan, export = export_plan(cfg, args)
    if args.to == "accelerate":
        text = to_yaml(export, cfg, plan, args.recipe)
    else:
        text = json.dumps(export.content, indent=2) + "\n"
    output = Path(args.output)
    _write_atomically(output, text)
    for note in export.notes:  # printed, not logged: they are the command's output, whatever the log level
        print(f"bigtrain: note: {note}", file=sys.stderr)
    log.info("wrote the plan (%s) for %s to %s", _summary(plan), args.to, output)
    return 0


def _summary(plan: Plan) -> str:
    fields: dict[str, Any] = {"backend": plan.backend, "zero_stage": plan.zero_stage, "dp": plan.dp, "tp": plan.tp}
    fields["micro_batch_size"] = plan.micro_batch_size
    return ", ".join(f"{k}={v}" for k, v in fields.items())
