"""``bigtrain plan``: the flags handed to ``bigtrain.plan`` (api/planning.py, the one code path), printed as the table
or JSON; the exit code.

Exit codes: 0 a plan fits, 2 bad input, 3 nothing fits (the best candidate is still printed, with ``fits: false``,
and one sentence says what would make it fit).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from bigtrain.config.schema import FP8_CHOICES, METHODS, PRECISIONS
from bigtrain.objectives import OBJECTIVES

if TYPE_CHECKING:  # the planner's search is imported where a plan is asked for, not by every command
    from bigtrain.api.result import PlanResult

EXIT_NO_FIT = 3


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
    parser.add_argument("--seq-len", type=int, help="sequence length (a causal LM's, or a text classifier's rows)")
    parser.add_argument(
        "--image-size",
        type=int,
        help="pixels per side of an image classifier's inputs (default: the model's, or 224), or of a vision-language "
        "model's images (default 448)",
    )
    parser.add_argument("--images-per-row", type=float, help="a vision-language model's images per row (default 1)")
    parser.add_argument("--global-batch-size", type=int, help="sequences per optimizer step")
    parser.add_argument("--mixed-precision", choices=PRECISIONS, help="compute dtype")
    parser.add_argument(
        "--method",
        choices=METHODS,
        help="what is trained: full, lora, qlora, or auto (the planner picks; default: the recipe's, else full); "
        "classifiers: full or lora",
    )
    parser.add_argument(
        "--objective",
        choices=["auto", *OBJECTIVES],
        help="what is minimised (default: the recipe's, else the task's own: sft or classification), or a preference "
        "objective: dpo, ipo, orpo, simpo (--global-batch-size then counts pairs; dpo/ipo weigh where their reference "
        "model's log-probabilities come from), or grpo (--global-batch-size counts completions)",
    )
    rollouts = parser.add_argument_group("grpo's rollouts (--objective grpo: each step generates its completions)")
    rollouts.add_argument(
        "--prompt-length", type=int, help="prompt tokens (default: the recipe's data.max_prompt_length, else 512)"
    )
    rollouts.add_argument(
        "--completion-length", type=int, help="the most tokens a completion has (default: the recipe's, else 512)"
    )
    rollouts.add_argument("--num-generations", type=int, help="completions per prompt (default: the recipe's, else 8)")
    rollouts.add_argument(
        "--beta", type=float, help="the KL term's weight (default: the recipe's, else 0: no reference model)"
    )
    parser.add_argument(
        "--epochs", type=float, help="passes the run makes over its data (default 1): a precomputed reference's share"
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
    network = parser.add_argument_group(
        "slow links between groups of GPUs (the planner then weighs local SGD / DiLoCo; docs/slow-links.md)"
    )
    network.add_argument("--inter-node-bandwidth", help="bandwidth between nodes, per node, e.g. 100Gb/s or 12.5GB/s")
    network.add_argument("--inter-node-latency", help="one-way delay between nodes, e.g. 25us (default 25us)")
    network.add_argument("--sites", type=int, help="the GPUs split into this many equal sites")
    network.add_argument("--site-bandwidth", help="bandwidth between sites, per site, e.g. 10Gb/s")
    network.add_argument("--site-latency", help="one-way delay between sites, e.g. 30ms")
    parser.add_argument("--fix", action="append", default=[], metavar="KEY=VALUE", help="pin a plan field")
    _add_output_arguments(parser)


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """What the command prints: the table, JSON, the simulated step, the legend, the scaling view."""
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="verify the chosen plan's peak memory by running the training step on fake tensors",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument(
        "--all",
        action="store_true",
        help="also show the plans the trainer cannot run yet (e.g. expert parallel with LoRA), with the reason",
    )
    parser.add_argument(
        "--legend", action="store_true", help="explain every abbreviation of the plan names and every column"
    )
    parser.add_argument(
        "--losses",
        metavar="N,M",
        help="also plan for the GPUs left after losing N (and M...) of them, as bigtrain train --elastic would, and "
        "show each plan's step time: what a failure costs (e.g. 1,8: one GPU, one node of 8)",
    )
    parser.add_argument(
        "--scaling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show the chosen plan's throughput from one GPU to --gpus (default: for classifiers, whose measure it is)",
    )


def run_plan_command(args: argparse.Namespace) -> int:
    from bigtrain.api.planning import plan

    if args.legend:
        from bigtrain.planner.explain import COLUMNS, legend

        print("\n".join(["plan names:", *legend(), "", "columns:", f"  {COLUMNS}"]))
        return 0
    asked = _asked(args)
    result = plan(args.model, **asked)
    losses = None
    if args.losses is not None:
        from bigtrain.cli.plan_losses import after_losses

        losses = after_losses(args.losses, result, lambda **changed: plan(args.model, **{**asked, **changed}))
    out = result.to_dict(include_unrunnable=args.all)
    if args.simulate and result.searched[0].runnable:
        from bigtrain.measure.simulate import not_simulated

        reason = not_simulated(result.plan)
        if reason is not None:  # a plan the simulator cannot run: said, and the plan is still printed
            print(f"bigtrain: note: --simulate cannot simulate the chosen plan: {reason}", file=sys.stderr)
        else:
            out["simulated"] = result.simulate()
    sentence = result.what_would_fit()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        if args.recipe:
            own = _recipe_s_own_plan(args, result)
            print(own + "\n" if own else "", end="")
        print(result.explain(show_unrunnable=args.all, scaling=args.scaling))
        if losses is not None:
            print(f"\n{losses}")
        if "simulated" in out:
            simulated, best = out["simulated"]["peak_bytes"], result.plan
            where = f"rank 0 of {best.world_size}"
            if "pp_rank" in out["simulated"]:
                where = f"the busiest pp rank ({out['simulated']['pp_rank']} of {best.pp}), {where[5:]} ranks"
            print(
                f"\nsimulated peak of the chosen plan on {where}: {simulated / 2**30:.2f} GiB "
                f"(predicted {result.memory.total_bytes / 2**30:.2f} GiB)"
            )
    if sentence:
        print(
            f"bigtrain: no plan fits in {result.cluster.gpu.memory_bytes / 2**30:.1f} GiB per GPU. {sentence}",
            file=sys.stderr,
        )
        return EXIT_NO_FIT
    return 0


def _asked(args: argparse.Namespace) -> dict[str, Any]:
    """The command's arguments as ``bigtrain.plan``'s keywords."""
    from bigtrain.api.request import CLI

    return dict(
        recipe=args.recipe,
        gpus=args.gpus,
        gpu=args.gpu,
        gpu_memory=args.gpu_memory,
        gpus_per_node=args.gpus_per_node,
        host_memory=args.host_memory,
        seq_len=args.seq_len,
        global_batch_size=args.global_batch_size,
        mixed_precision=args.mixed_precision,
        method=args.method,
        lora_r=args.lora_r,
        compile=args.compile,
        fp8=args.fp8,
        fix=args.fix,
        hardware_profile=args.hardware_profile,
        allow_unrunnable=args.all,
        image_size=args.image_size,
        images_per_row=args.images_per_row,
        inter_node_bandwidth=args.inter_node_bandwidth,
        inter_node_latency=args.inter_node_latency,
        sites=args.sites,
        site_bandwidth=args.site_bandwidth,
        site_latency=args.site_latency,
        objective=args.objective,
        epochs=args.epochs,
        rollout=dict(
            prompt_length=args.prompt_length,
            completion_length=args.completion_length,
            num_generations=args.num_generations,
            beta=args.beta,
        ),
        _spell=CLI,
    )


def _recipe_s_own_plan(args: argparse.Namespace, result: PlanResult) -> str | None:
    """For a recipe with a written plan: that plan predicted first (what ``bigtrain train`` will run), and whether and
    why the planner's choice below would be better."""
    from bigtrain.api.planning import recipe_plan
    from bigtrain.config.load import load_recipe
    from bigtrain.errors import ConfigError

    cfg = load_recipe(args.recipe)
    if cfg.parallel.plan == "auto":
        return None
    cluster = result.cluster
    try:
        own = recipe_plan(
            cfg, gpus=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node, gpu=args.gpu, gpu_memory=args.gpu_memory
        )
    except ConfigError as e:
        return f"the recipe's own plan cannot run on these {cluster.num_gpus} GPUs: {e}"
    line = f"the recipe's own plan (what bigtrain train runs): {own.summary()}"
    if not own.fits:
        return f"{line}; it does not fit: {own.searched[0].rejected_because or own.searched[0].unsupported}"
    if own.plan == result.plan:
        return f"{line}; it is the planner's choice"
    faster = 1 - result.time.step_s / own.time.step_s
    if round(faster, 3) == 0:  # an exact tie, or one too close to show: not "-0.0% slower"
        verdict = "the planner's choice below is as fast"
    elif faster > 0:
        verdict = f"the planner's choice below is {faster:.1%} faster"
    else:
        verdict = f"the planner's choice below is {-faster:.1%} slower but simpler (a near tie)"
    return f"{line}; {verdict}"
