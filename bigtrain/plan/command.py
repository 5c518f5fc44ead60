"""``bigtrain plan``: gather model, hardware and batch from flags, a recipe or detection; search; print; exit code.

Exit codes: 0 a plan fits, 2 bad input, 3 nothing fits (the best candidate is still printed, with ``fits: false``,
and one sentence says what would make it fit).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from typing import Any

from bigtrain.errors import ConfigError
from bigtrain.plan.explain import render_table, to_json, what_would_fit
from bigtrain.plan.hardware import Cluster, detect_local, make_cluster
from bigtrain.plan.model_stats import ModelStats, load_model_config
from bigtrain.plan.search import Candidate, parse_fix, search

EXIT_NO_FIT = 3
DEFAULT_TOKENS_PER_STEP = 2**20  # ~1M tokens per optimizer step when no batch is given


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", help="recipe to take model, seq_len, batch and precision from")
    parser.add_argument("--model", help="preset name, local HF model folder, or config.json")
    parser.add_argument("--gpus", type=int, help="number of GPUs (default: detected)")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: min(gpus, 8))")
    parser.add_argument("--gpu-memory", help="memory per GPU, e.g. 80GB (binary units); overrides the GPU table")
    parser.add_argument("--gpu", help="GPU type, e.g. H100, A100-40GB, L4 (default: detected, else H100)")
    parser.add_argument("--seq-len", type=int, help="sequence length")
    parser.add_argument("--global-batch-size", type=int, help="sequences per optimizer step")
    parser.add_argument("--mixed-precision", choices=("fp32", "bf16", "fp16"), help="compute dtype")
    parser.add_argument("--fix", action="append", default=[], metavar="KEY=VALUE", help="pin a plan field")
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="verify the chosen plan's peak memory by running the training step on fake tensors",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


@dataclass
class PlanRequest:
    stats: ModelStats
    model_config: dict[str, Any]
    cluster: Cluster
    seq_len: int
    global_batch_size: int
    mixed_precision: str
    fixed: dict[str, Any]


def build_request(args: argparse.Namespace) -> PlanRequest:
    recipe = None
    if args.recipe:
        from bigtrain.config.load import load_recipe

        recipe = load_recipe(args.recipe)
    if args.model:
        model_config = load_model_config(args.model)
    elif recipe is not None:
        model_config = load_model_config(recipe.model.config or recipe.model.name_or_path or "")
    else:
        raise ConfigError("bigtrain plan needs a model: --model PRESET|PATH, or a recipe")
    stats = ModelStats.from_config(model_config)

    per_node = args.gpus_per_node
    if args.gpus and (args.gpu or args.gpu_memory):
        name, count, free = None, 0, None
    else:
        name, count, free = detect_local()
        job = _job_hardware() if name is not None else None
        if job is not None:  # inside torchrun/accelerate: the whole job, limited by its most constrained rank
            count, per_node, free = job
    gpus = args.gpus or count
    if not gpus:
        raise ConfigError("no GPU detected on this machine; give --gpus N (and --gpu NAME or --gpu-memory SIZE)")
    cluster = make_cluster(gpus, per_node, args.gpu or name, args.gpu_memory or free)

    max_len = model_config.get("max_position_embeddings") or model_config.get("n_positions") or 2048
    seq_len = args.seq_len or (recipe.data.seq_len if recipe and recipe.data.seq_len else min(2048, max_len))
    if seq_len < 2:
        raise ConfigError(f"--seq-len {seq_len} must be at least 2")
    if args.global_batch_size:
        batch = args.global_batch_size
    elif recipe is not None and args.recipe:
        batch = recipe.train.global_batch_size
    else:
        batch = max(1, DEFAULT_TOKENS_PER_STEP // seq_len // gpus) * gpus
    precision = args.mixed_precision or (recipe.train.mixed_precision if recipe else "bf16")
    return PlanRequest(stats, model_config, cluster, seq_len, batch, precision, parse_fix(args.fix))


def _job_hardware() -> tuple[int, int, int] | None:
    """(world size, ranks per node, smallest free memory of any rank) when run under a launcher, else None."""
    from bigtrain.parallel.runtime import (
        init_process_group,
        pick_device,
        read_launch_env,
        smallest_free_memory,
    )

    env = read_launch_env()
    if not env.launched:
        return None
    import torch.distributed as dist

    device = pick_device(env)
    init_process_group(env, device, timeout_s=120)
    try:
        return env.world_size, env.local_world_size, smallest_free_memory(env, device)
    finally:
        dist.destroy_process_group()


def _search(req: PlanRequest, **changes: Any) -> list[Candidate]:
    r = replace(req, **changes)
    return search(r.stats, r.cluster, r.seq_len, r.global_batch_size, r.mixed_precision, r.fixed)


def alternatives_that_fit(req: PlanRequest) -> dict[str, str]:
    """Try the obvious ways out (more GPUs, offload, shorter sequences) and say which would fit."""
    found: dict[str, str] = {}
    for factor in (2, 4, 8, 16, 32, 64):
        gpus = req.cluster.num_gpus * factor
        batch = max(req.global_batch_size, gpus) // gpus * gpus
        more = replace(req.cluster, num_gpus=gpus)
        if _search(req, cluster=more, global_batch_size=batch)[0].fits:
            found["gpus"] = f"{gpus} GPUs (--gpus {gpus})"
            break
    # offloading needs a sharded backend, and is only a way out if the user has not pinned it already
    if req.fixed.get("backend") != "ddp":
        for key in ("offload_params", "offload_optimizer"):
            if key in req.fixed:
                continue
            try:
                if _search(req, fixed={**req.fixed, key: True})[0].fits:
                    found["offload"] = f"offload (--fix {key}=true)"
                    break
            except ConfigError:  # no plan of that kind meets the pins
                continue
    for div in (2, 4, 8, 16):
        seq = req.seq_len // div
        if seq >= 2 and _search(req, seq_len=seq)[0].fits:
            found["seq"] = f"a shorter sequence (--seq-len {seq})"
            break
    return found


def run_plan_command(args: argparse.Namespace) -> int:
    req = build_request(args)
    candidates = _search(req)
    best = candidates[0]
    result = to_json(candidates, req.stats)
    if args.simulate:
        from bigtrain.plan.simulate import simulate

        result["simulated"] = {
            "peak_bytes": simulate(
                req.model_config, best.plan, req.seq_len, req.mixed_precision, req.global_batch_size
            )["Total"],
            "world_size": best.plan.world_size,
        }
    sentence = None if best.fits else what_would_fit(alternatives_that_fit(req))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render_table(candidates, req.stats, req.cluster, req.seq_len, req.global_batch_size))
        if "simulated" in result:
            simulated = result["simulated"]["peak_bytes"]
            print(
                f"\nsimulated peak of the chosen plan on rank 0 of {best.plan.world_size}: {simulated / 2**30:.2f} GiB "
                f"(predicted {best.memory.total_bytes / 2**30:.2f} GiB)"
            )
    if sentence:
        print(
            f"bigtrain: no plan fits in {req.cluster.gpu.memory_bytes / 2**30:.1f} GiB per GPU. {sentence}",
            file=sys.stderr,
        )
        return EXIT_NO_FIT
    return 0
