"""``bigtrain prepare RECIPE [--set KEY=VALUE ...]``: build the recipe's data cache ahead of training (on a CPU node,
before the GPU job), as Axolotl's preprocess step does; a later ``bigtrain train`` of the same recipe (any world
size, any plan) maps what this wrote instead of tokenising again."""

from __future__ import annotations

import argparse
import sys
import time

from bigtrain.cli.recipe_args import add_overrides


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="YAML recipe whose data.path (and data.eval_path) to tokenise and pack")
    add_overrides(
        parser, "override a recipe key as bigtrain train would, e.g. --set data.cache_dir=/shared/cache (repeatable)"
    )


def run_prepare_command(args: argparse.Namespace) -> int:
    from bigtrain.config.load import load_recipe
    from bigtrain.train.start_up import resolve

    start = time.perf_counter()
    resolved = resolve(load_recipe(args.recipe, args.overrides))
    data, held_out = resolved.job.read_data(resolved.cfg, resolved.hf_config)
    for key, part in (("data.path", data), ("data.eval_path", held_out)):
        if part is None:
            continue
        note = getattr(part, "cache_note", None)
        said = note if note is not None else f"{key}: read (this task's data has no cache yet; read at each start)"
        if getattr(part, "streamed", False):
            said = f"{key}: streamed (data.streaming), read as training goes: nothing to build ahead"
        print(f"bigtrain: {said} | {part.description}", file=sys.stderr)
    print(f"bigtrain: data prepared in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0
