"""``bigtrain plan``: gather model, hardware and batch from flags, a recipe or detection; search; print; exit code.

Exit codes: 0 a plan fits, 2 bad input, 3 nothing fits (the best candidate is still printed, with ``fits: false``,
and one sentence says what would make it fit).
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from dataclasses import dataclass, replace
from typing import Any

import yaml

from bigtrain.config.load import check_minimum, coerce
from bigtrain.config.plan import ZERO_STAGES
from bigtrain.config.schema import FP8_CHOICES, METHODS, PRECISIONS, ParallelConfig
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.planner.explain import render_table, to_json, what_would_fit
from bigtrain.planner.hardware import Cluster, detect_local, make_cluster
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.planner.search import PLAN_FIELDS, Candidate, search

EXIT_NO_FIT = 3
DEFAULT_TOKENS_PER_STEP = 2**20  # ~1M tokens per optimizer step when no batch is given


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", help="recipe to take model, seq_len, batch and precision from")
    parser.add_argument("--model", help="preset name, local HF model folder, or config.json")
    parser.add_argument("--gpus", type=int, help="number of GPUs (default: detected)")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: min(gpus, 8))")
    parser.add_argument("--gpu-memory", help="memory per GPU, e.g. 80GB (binary units); overrides the GPU table")
    parser.add_argument(
        "--host-memory", help="host memory per node for offloaded state, e.g. 2TB (default: 256 GiB per GPU)"
    )
    parser.add_argument("--gpu", help="GPU type, e.g. H100, A100-40GB, L4 (default: detected, else H100)")
    parser.add_argument("--seq-len", type=int, help="sequence length")
    parser.add_argument("--global-batch-size", type=int, help="sequences per optimizer step")
    parser.add_argument("--mixed-precision", choices=PRECISIONS, help="compute dtype")
    parser.add_argument(
        "--method",
        choices=METHODS,
        help="what is trained: full, lora, qlora, or auto (the planner picks; default: the recipe's, else full)",
    )
    parser.add_argument("--lora-r", type=int, help="adapter rank under lora/qlora (default: the recipe's, else 16)")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="plan for train.compile true or false (default: the recipe's): plans it cannot run are not offered",
    )
    parser.add_argument(
        "--fp8",
        choices=FP8_CHOICES,
        help="plan for train.fp8 (default: the recipe's, else none); auto: the planner weighs none, tensorwise and "
        "rowwise where --hardware-profile measured FP8 matmuls",
    )
    parser.add_argument(
        "--hardware-profile",
        metavar="FILE",
        help="a profile from bigtrain probe: measured matmul rates and link bandwidth instead of the GPU table's",
    )
    parser.add_argument("--fix", action="append", default=[], metavar="KEY=VALUE", help="pin a plan field")
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="verify the chosen plan's peak memory by running the training step on fake tensors",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument(
        "--all",
        action="store_true",
        help="also show the plans the trainer cannot run yet (DeepSpeed, tp, pp, ...), with the reason",
    )


def parse_fix(items: list[str]) -> dict[str, Any]:
    """``--fix key=value`` pins: a Plan field, its value read and checked exactly as the recipe's ``parallel.key``."""
    hints = typing.get_type_hints(ParallelConfig)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or key not in PLAN_FIELDS:
            raise ConfigError(f"--fix {item!r}: unknown plan field; use one of {', '.join(PLAN_FIELDS)}")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        if value is None:
            raise ConfigError(f"--fix {key}= needs a value")
        out[key] = coerce(value, hints[key], f"--fix {key}")
        check_minimum(f"parallel.{key}", out[key], shown=f"--fix {key}")
        if key == "zero_stage" and not any(out[key] in stages for stages in ZERO_STAGES.values()):
            modes = ", ".join(f"{', '.join(map(str, v))} ({k})" for k, v in ZERO_STAGES.items())
            raise ConfigError(f"--fix zero_stage={out[key]} is not a stage of any backend; use {modes}")
    return out


@dataclass
class PlanRequest:
    stats: ModelStats
    model_config: dict[str, Any]
    cluster: Cluster
    workload: Workload
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

    cluster = cluster_from_args(
        args, "no GPU detected on this machine; give --gpus N (and --gpu NAME or --gpu-memory SIZE)"
    )
    gpus = cluster.num_gpus
    for flag, value, minimum in (("--seq-len", args.seq_len, 2), ("--global-batch-size", args.global_batch_size, 1)):
        if value is not None and value < minimum:
            raise ConfigError(f"{flag} {value} must be at least {minimum}")
    seq_len = args.seq_len or (recipe.data.seq_len if recipe and recipe.data.seq_len else default_seq_len(model_config))
    check_plan_seq_len(model_config, seq_len)
    if args.global_batch_size:
        batch = args.global_batch_size
    elif recipe is not None and args.recipe:
        batch = recipe.train.global_batch_size
    else:
        batch = max(1, DEFAULT_TOKENS_PER_STEP // seq_len // gpus) * gpus
    precision = args.mixed_precision or (recipe.train.mixed_precision if recipe else "bf16")
    compile_blocks = args.compile if args.compile is not None else (recipe.train.compile if recipe else False)
    fp8 = getattr(args, "fp8", None) or (recipe.train.fp8 if recipe else "none")
    method = args.method or (recipe.train.method if recipe else "full")
    lora_rank = args.lora_r or (recipe.lora.r if recipe else 16)
    if lora_rank < 1:
        raise ConfigError(f"--lora-r {lora_rank} must be at least 1")
    workload = Workload(
        seq_len=seq_len,
        global_batch_size=batch,
        mixed_precision=precision,
        compile=compile_blocks,
        fp8=fp8,
        method=method,
        lora_rank=lora_rank,
        modules_to_save=tuple(recipe.lora.modules_to_save or ()) if recipe else (),
    )
    return PlanRequest(stats, model_config, cluster, workload, parse_fix(args.fix))


def cluster_from_args(args: argparse.Namespace, no_gpu: str, profile: str | None = None) -> Cluster:
    """The cluster the flags describe (``--gpus``, ``--gpus-per-node``, ``--gpu``, ``--gpu-memory``), else this
    machine's GPUs (the whole job's under a launcher); with a ``bigtrain probe`` profile (``profile``, or
    ``--hardware-profile``), its measured rates and link. ``no_gpu``: the error when there is nothing to plan for."""
    for flag, value in (("--gpus", args.gpus), ("--gpus-per-node", args.gpus_per_node)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value} must be at least 1")
    if args.gpus and args.gpus_per_node and args.gpus > args.gpus_per_node and args.gpus % args.gpus_per_node:
        raise ConfigError(
            f"--gpus {args.gpus} is not a whole number of nodes of --gpus-per-node {args.gpus_per_node}; use a "
            f"multiple such as {args.gpus // args.gpus_per_node * args.gpus_per_node or args.gpus_per_node}"
        )
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
        raise ConfigError(no_gpu)
    host = getattr(args, "host_memory", None)
    cluster = make_cluster(gpus, per_node, args.gpu or name, args.gpu_memory or free, host)
    profile = profile or getattr(args, "hardware_profile", None)
    if profile:
        from bigtrain.planner.profile import gpu_from_profile, load_profile

        stated = cluster.gpu.memory_bytes if (args.gpu_memory or free) else None
        cluster = replace(cluster, gpu=gpu_from_profile(load_profile(profile), cluster.gpu, memory_bytes=stated))
    return cluster


def check_plan_seq_len(model_config: dict[str, Any], seq_len: int) -> None:
    """The sequence against the model's positions, by the rule ``bigtrain train`` applies (train/checks.py): beyond
    a learned position table (GPT-2) refused, beyond a rotary model's max_position_embeddings a warning."""
    from bigtrain.config.hf import hf_config_from_dict, one_block
    from bigtrain.models.build import build_meta_model
    from bigtrain.train.checks import check_sequence_length

    hf_config = hf_config_from_dict(dict(model_config))
    probe = build_meta_model(one_block(hf_config), "auto")
    check_sequence_length(hf_config, probe, seq_len, is_main=True, key="--seq-len")


def default_seq_len(model_config: dict[str, Any]) -> int:
    """The sequence length to plan for when none is given: the model's maximum, at most 2048."""
    max_len = model_config.get("max_position_embeddings") or model_config.get("n_positions") or 2048
    return min(2048, max_len)


def _job_hardware() -> tuple[int, int, int] | None:
    """(world size, ranks per node, smallest free memory of any rank) when run under a launcher, else None."""
    from bigtrain.runtime import (
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
    """The search for ``req`` with some of its parts changed (``cluster``, ``fixed``, or the workload's fields)."""
    workload_fields = {k: changes.pop(k) for k in ("seq_len", "global_batch_size") if k in changes}
    r = replace(req, workload=replace(req.workload, **workload_fields), **changes)
    return search(r.stats, r.cluster, r.workload, r.fixed)


def _fits(candidates: list[Candidate]) -> bool:
    """Whether the best candidate is a plan the trainer can run and that fits (the search ranks those first)."""
    return candidates[0].fits and candidates[0].runnable


def alternatives_that_fit(req: PlanRequest) -> dict[str, str]:
    """Try the obvious ways out (more GPUs, offload, shorter sequences) and say which would fit. More GPUs come as
    nodes of 8 when the request's nodes are smaller than that (a lone GPU's "node" says nothing about the nodes it
    would join), which is what lets context parallelism split long rows over them."""
    found: dict[str, str] = {}
    for factor in (2, 4, 8, 16, 32, 64):
        gpus = req.cluster.num_gpus * factor
        batch = max(req.workload.global_batch_size, gpus) // gpus * gpus
        per_node = max(req.cluster.gpus_per_node, min(gpus, 8))
        more = replace(req.cluster, num_gpus=gpus, gpus_per_node=per_node)
        candidates = _search(req, cluster=more, global_batch_size=batch)
        if _fits(candidates):
            plan = candidates[0].plan
            how = f": each row split over {plan.cp} of them, --fix cp={plan.cp}" if plan.cp > 1 else ""
            found["gpus"] = f"{gpus} GPUs (--gpus {gpus}{how})"
            break
    # offloading needs a sharded backend, and is only a way out if the user has not pinned it already
    if req.fixed.get("backend") != "ddp":
        for key in ("offload_params", "offload_optimizer"):
            if key in req.fixed:
                continue
            try:
                if _fits(_search(req, fixed={**req.fixed, key: True})):
                    found["offload"] = f"offload (--fix {key}=true)"
                    break
            except ConfigError:  # no plan of that kind meets the pins
                continue
    for div in (2, 4, 8, 16):
        seq = req.workload.seq_len // div
        if seq >= 2 and _fits(_search(req, seq_len=seq)):
            found["seq"] = f"a shorter sequence (--seq-len {seq})"
            break
    return found


def _simulate_into(result: dict[str, Any], req: PlanRequest, best: Candidate) -> None:
    """``--simulate``: the chosen plan's simulated peak into ``result``, or a note why it cannot be simulated."""
    from bigtrain.simulate import not_simulated, simulate

    reason = not_simulated(best.plan)
    if reason is not None:
        print(f"bigtrain: note: --simulate cannot simulate the chosen plan: {reason}", file=sys.stderr)
        return
    peak = simulate(req.model_config, best.plan, req.workload)
    result["simulated"] = {"peak_bytes": peak["Total"], "world_size": best.plan.world_size}
    if "pp_rank" in peak:  # pipelined: every pp rank was simulated, this is the busiest
        result["simulated"]["pp_rank"] = peak["pp_rank"]


def run_plan_command(args: argparse.Namespace) -> int:
    req = build_request(args)
    candidates = _search(req)
    best = candidates[0]
    if not best.runnable and not args.all:
        raise ConfigError(
            f"no plan the planner offers meets the pins: {best.unsupported}; "
            "add --all to see such plans predicted anyway"
        )
    result = to_json(candidates, req.stats, include_unrunnable=args.all)
    if args.simulate and best.runnable:
        _simulate_into(result, req, best)
    sentence = None if best.fits and best.runnable else what_would_fit(alternatives_that_fit(req))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render_table(candidates, req.stats, req.cluster, req.workload, show_unrunnable=args.all))
        if "simulated" in result:
            simulated = result["simulated"]["peak_bytes"]
            where = f"rank 0 of {best.plan.world_size}"
            if "pp_rank" in result["simulated"]:
                where = f"the busiest pp rank ({result['simulated']['pp_rank']} of {best.plan.pp}), {where[5:]} ranks"
            print(
                f"\nsimulated peak of the chosen plan on {where}: {simulated / 2**30:.2f} GiB "
                f"(predicted {best.memory.total_bytes / 2**30:.2f} GiB)"
            )
    if sentence:
        print(
            f"bigtrain: no plan fits in {req.cluster.gpu.memory_bytes / 2**30:.1f} GiB per GPU. {sentence}",
            file=sys.stderr,
        )
        return EXIT_NO_FIT
    return 0
