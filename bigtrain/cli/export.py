"""``bigtrain export RECIPE --to accelerate|deepspeed|hf-trainer -o FILE``: the recipe's plan, written for another
tool.

The plan is the one ``bigtrain train`` would run (``bigtrain.recipe_plan``, the one code path): a manual plan
resolved for ``--gpus`` ranks (or for the product of its degrees when the recipe states them all), ``plan: auto``
chosen by the planner for ``--gpus`` of ``--gpu`` / ``--gpu-memory`` (or the GPUs detected here). Notes about the
translation go to stderr; the file is written only when the whole export succeeded.
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

from bigtrain.cli.recipe_args import add_overrides
from bigtrain.config.load import load_recipe
from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.integrations import TARGETS, Export

log = logging.getLogger("bigtrain")


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="YAML recipe, e.g. recipes/quickstart.yaml")
    parser.add_argument("--to", required=True, choices=TARGETS, help="the tool the file is for")
    parser.add_argument("-o", "--output", required=True, help="the file to write (YAML for accelerate, else JSON)")
    add_overrides(parser)
    parser.add_argument("--gpus", type=int, help="GPUs of the job (default: the plan's degrees, or detected)")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs per machine (default: min(gpus, 8))")
    parser.add_argument("--gpu", help="plan: auto: GPU type, e.g. H100, A100-40GB (default: detected, else H100)")
    parser.add_argument("--gpu-memory", help="plan: auto: memory per GPU, e.g. 80GB; overrides the GPU table")
    parser.add_argument(
        "--hardware-profile", metavar="FILE", help="plan: auto: a bigtrain probe profile instead of the GPU table"
    )


def export_plan(cfg: RecipeConfig, args: argparse.Namespace) -> tuple[Plan, Export]:
    """The recipe's plan (``bigtrain.recipe_plan``) and what the target makes of it."""
    from bigtrain.api.planning import recipe_plan
    from bigtrain.api.request import CLI

    result = recipe_plan(
        cfg,
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        gpu=getattr(args, "gpu", None),
        gpu_memory=getattr(args, "gpu_memory", None),
        hardware_profile=getattr(args, "hardware_profile", None),
        _spell=CLI,
    )
    return result.plan, result.export(args.to, args.gpus_per_node)


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
