"""The command line: ``bigtrain train RECIPE [--set a.b=v ...] [--nproc N]``, ``bigtrain plan ...``,
``bigtrain prepare RECIPE``, ``bigtrain export RECIPE --to accelerate|deepspeed|hf-trainer -o FILE``,
``bigtrain export-model CHECKPOINT -o HF_DIR``, ``bigtrain probe [-o FILE] [--nproc N]``,
``bigtrain report OUTPUT_DIR`` and ``bigtrain generate OUTPUT_DIR [--prompt TEXT] [--chat]`` (also as
``python -m bigtrain``). Turns every ConfigError into one
``bigtrain: error: ...`` line and exit code 2."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from typing import Any

from bigtrain import __version__
from bigtrain.cli.elastic_args import add_elastic_arguments
from bigtrain.cli.export import add_export_arguments, run_export_command
from bigtrain.cli.failures import (
    EXIT_AFTER,
    EXIT_INTERRUPTED,
    last_good_checkpoint,
    peer_lost,
    rank_tag,
    say,
    stop_for_lost_peer,
)
from bigtrain.cli.generate import add_generate_arguments, run_generate_command
from bigtrain.cli.plan import add_plan_arguments, run_plan_command
from bigtrain.cli.prepare import add_prepare_arguments, run_prepare_command
from bigtrain.cli.quiet import quiet_libraries
from bigtrain.cli.recipe_args import add_overrides
from bigtrain.config.schema import RecipeConfig
from bigtrain.errors import CheckpointNotWritten, ConfigError, RunFinished, TrainingDiverged
from bigtrain.runtime import LaunchEnv, die_with_parent, read_launch_env

EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 4  # the loss or gradient norm became NaN or infinite (3 is bigtrain plan's "nothing fits")
EXIT_CHECKPOINT_NOT_WRITTEN = 5  # a checkpoint (or the final model) could not be written, e.g. the disk is full
# how long a rank above 0 that failed on bad input waits before it exits under --nproc: the lowest rank's line is
# the one said, and rank 0 usually meets the same input within a second (a lone higher rank's error costs this much)
LOWER_RANK_GRACE_S = 3.0
EXIT_CODES = {
    ConfigError: EXIT_BAD_INPUT,
    TrainingDiverged: EXIT_DIVERGED,
    CheckpointNotWritten: EXIT_CHECKPOINT_NOT_WRITTEN,
}


# the libraries whose versions decide what bigtrain does; constraints.txt pins the set the suite passed on
VERSIONED = ("torch", "transformers", "accelerate", "deepspeed", "peft", "torchao", "datasets")


def _versions() -> str:
    """``bigtrain --version``: bigtrain's own, then each library it runs with (read from the installed metadata, so
    nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    libraries = ", ".join(f"{name} {installed(name)}" for name in VERSIONED)
    return f"bigtrain {__version__} ({libraries}; tested: constraints.txt)"


class _VersionAction(argparse.Action):
    """``--version`` as one unwrapped line (argparse's own action rewraps it to the terminal's width)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help=kwargs.get("help"))  # type: ignore[arg-type]

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(_versions())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bigtrain", description="Train HuggingFace causal LMs and image or text classifiers on 1 to N GPUs."
    )
    parser.add_argument("--version", action=_VersionAction, help="print the versions of bigtrain and its libraries")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show what the libraries log and warn (filtered by default: bigtrain/cli/quiet.py), on every rank",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train with a recipe (this rank under torchrun/accelerate, or --nproc N)")
    train.add_argument("recipe", help="YAML recipe, e.g. recipes/quickstart.yaml")
    add_overrides(train, "override a recipe key, e.g. --set train.steps=20 (repeatable)")
    train.add_argument(
        "--nproc", type=int, default=None, help="start N local worker processes with torch's elastic launcher"
    )
    # set by --nproc for its workers: the launcher prints their one-line errors, once (cli/failures.py)
    train.add_argument("--quiet-failures", action="store_true", help=argparse.SUPPRESS)
    train.add_argument(
        "--replica-group",
        type=int,
        default=None,
        metavar="I",
        help="with parallel.replica_failures=continue: this job is replica group I of the run (--nproc sets it; "
        "under torchrun, start one job per group; docs/slow-links.md)",
    )
    add_elastic_arguments(train)
    train.add_argument(
        "--dry-run",
        action="store_true",
        help="check recipe, data, model and plan (for --nproc N ranks, else 1), print the resolved recipe and the "
        "plan, train nothing",
    )
    add_prepare_arguments(
        sub.add_parser("prepare", help="tokenise and pack a recipe's data into the data cache ahead of training")
    )
    add_generate_arguments(
        sub.add_parser(
            "generate",
            help="generate text (or a text-to-image model's picture) with a trained model: a run's output_dir, a "
            "model or adapter",
        )
    )
    plan = sub.add_parser("plan", help="choose a plan from model size and GPU memory, and explain it")
    add_plan_arguments(plan)
    add_export_arguments(
        sub.add_parser("export", help="write the recipe's plan as an accelerate, DeepSpeed or HF Trainer config")
    )
    export = sub.add_parser(
        "export-model", help="write a checkpoint as a HuggingFace model folder (one CPU process, no GPU needed)"
    )
    export.add_argument("checkpoint", help="a checkpoint folder (output_dir/checkpoints/step_N) or a run's output_dir")
    export.add_argument("-o", "--output", required=True, help="the HF folder to write (replaced if it exists)")
    export.add_argument(
        "--merge",
        action="store_true",
        help="an adapter checkpoint: write base + adapters as one HF model in the base's dtype (default: peft's "
        "adapter folder)",
    )
    probe = sub.add_parser(
        "probe", help="measure this machine's matmul rates, memory bandwidth and collective bandwidth (JSON profile)"
    )
    probe.add_argument("-o", "--output", help="write the profile here (default: print it)")
    probe.add_argument(
        "--nproc", type=int, default=None, help="measure collectives over N local ranks (torch's elastic launcher)"
    )
    report = sub.add_parser("report", help="draw a run's loss, eval loss, lr, tokens/s and memory per step as PNGs")
    report.add_argument("output_dir", help="the output_dir of a bigtrain train run (it holds metrics.jsonl)")
    report.add_argument("-o", "--output", help="folder for the PNGs (default: OUTPUT_DIR/report)")
    return parser


class _Lines(logging.Formatter):
    """``bigtrain: ...`` for bigtrain's own records, the library's logger name for the others'."""

    def format(self, record: logging.LogRecord) -> str:
        record.shown = "bigtrain" if record.name.partition(".")[0] == "bigtrain" else record.name
        return super().format(record)


def _setup_logging(env: LaunchEnv, verbose: bool) -> None:
    """bigtrain's own lines (``bigtrain: ...``) at INFO on rank 0 and WARNING elsewhere; the libraries' at WARNING
    under their own names (with ``-v``: INFO, unfiltered, on every rank)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Lines("%(shown)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    logging.getLogger("bigtrain").setLevel(logging.INFO if env.rank == 0 or verbose else logging.WARNING)
    if not verbose:
        quiet_libraries()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    env = read_launch_env()
    _setup_logging(env, args.verbose)
    if env.launched:
        die_with_parent()  # a launcher killed outright (kill -9) leaves no worker training on as an orphan
    quiet = getattr(args, "quiet_failures", False)  # bigtrain's --nproc launcher prints the workers' lines
    output_dir, timeout_s = None, None
    try:
        if args.command == "train":
            if args.mtbf is not None:  # a recipe key: checked with the others, passed on to the workers with them
                args.overrides.append(f"checkpoint.mtbf_hours={args.mtbf!r}")
            cfg = _recipe(args)
            output_dir, timeout_s = cfg.output_dir, cfg.train.collective_timeout_s
            return _train(args, cfg, env)
        if args.command == "prepare":
            return run_prepare_command(args)
        if args.command == "plan":
            return run_plan_command(args)
        if args.command == "export":
            return run_export_command(args)
        if args.command == "export-model":
            return _export_model(args)
        if args.command == "probe":
            return _probe(args, env)
        if args.command == "report":
            return _report(args)
        if args.command == "generate":
            return run_generate_command(args)
    except RunFinished as e:
        if env.rank == 0:  # nothing is wrong: said once, and exit 0 (schedulers re-queue a non-zero exit)
            sys.stderr.flush()
            os.write(2, f"bigtrain: {e}\n".encode())
        return 0
    except (ConfigError, TrainingDiverged, CheckpointNotWritten) as e:
        code = next(code for kind, code in EXIT_CODES.items() if isinstance(e, kind))
        say(f"error{rank_tag(env)}: {e}", env, quiet, code)
        if quiet and env.rank > 0:
            # every rank meets the same bad input; the launcher says the lowest rank's line, so a higher rank that got
            # there first gives rank 0 a moment to write its own (the agent's SIGTERM ends this wait when it does)
            time.sleep(LOWER_RANK_GRACE_S)
        return code
    except BrokenPipeError:  # the reader of our output went away (bigtrain plan ... | head): nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush then succeeds
        return 0
    except KeyboardInterrupt:  # Ctrl-C before the first step, or a second one: stop at once
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher's echo of the same Ctrl-C
        if env.rank == 0 or quiet:
            say(f"interrupted (Ctrl-C); {last_good_checkpoint(output_dir)}", env, quiet, EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except Exception as e:
        if not peer_lost(e):
            raise
        stop_for_lost_peer(e, env, quiet, output_dir, timeout_s)
    return 1


def _export_model(args: argparse.Namespace) -> int:
    from bigtrain.checkpoint.adapter_export import adapter_recipe, export_adapter, export_merged
    from bigtrain.checkpoint.export import export_model
    from bigtrain.checkpoint.layout import resolve_checkpoint

    log = logging.getLogger("bigtrain")
    cfg = adapter_recipe(resolve_checkpoint(args.checkpoint))
    if cfg is None:
        if args.merge:
            raise ConfigError(f"{args.checkpoint} trained the whole model: there is nothing to merge; drop --merge")
        folder = export_model(args.checkpoint, args.output)
        log.info("wrote %s as a HuggingFace model folder to %s", folder, args.output)
    elif args.merge:
        folder = export_merged(args.checkpoint, args.output, _peft_task_type(args.checkpoint, cfg))
        log.info("wrote %s merged into its base as a HuggingFace model folder to %s", folder, args.output)
    else:
        folder = export_adapter(args.checkpoint, args.output, _peft_task_type(args.checkpoint, cfg))
        log.info("wrote %s as a peft adapter folder to %s", folder, args.output)
    return 0


def _peft_task_type(checkpoint: str, cfg: Any) -> str | None:
    """peft's task type of the checkpoint's task (its recipe's model.task, resolved against its saved config)."""
    from transformers import AutoConfig

    from bigtrain.checkpoint.layout import HF_FILES, resolve_checkpoint
    from bigtrain.tasks import resolve

    hf_config = AutoConfig.from_pretrained(resolve_checkpoint(checkpoint) / HF_FILES, local_files_only=True)
    return resolve(hf_config, cfg.model.task).peft_task_type


def _report(args: argparse.Namespace) -> int:
    from bigtrain.cli.report import write_report

    for path in write_report(args.output_dir, args.output):
        print(path)
    return 0


def _check_nproc(args: argparse.Namespace) -> None:
    if args.nproc is not None and args.nproc < 1:
        raise ConfigError(f"--nproc={args.nproc} must be at least 1")


def _elastic(args: argparse.Namespace, env: LaunchEnv) -> Any:
    """The elastic settings of ``bigtrain train`` (None without --elastic), their limits checked."""
    from bigtrain.train.elastic import Elastic, parse_lose_rank

    if not args.elastic:
        if args.lose_rank is not None:
            raise ConfigError("--lose-rank is a drill of an elastic run; add --elastic")
        return None
    if args.nproc is None and not env.launched:
        raise ConfigError("--elastic starts again on the ranks that remain: give --nproc N, or run under torchrun")
    if args.nproc is not None and not 1 <= args.min_nproc <= args.nproc:
        raise ConfigError(f"--min-nproc={args.min_nproc} must be between 1 and --nproc={args.nproc}")
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts={args.max_restarts} must be 0 or more")
    lose = parse_lose_rank(args.lose_rank) if args.lose_rank is not None else None
    if lose is not None and args.nproc is None and not args.quiet_failures:  # its workers are launched, quiet
        raise ConfigError("--lose-rank is a drill of bigtrain's own launcher: use it with --nproc N --elastic")
    if lose is not None and args.nproc is not None and lose[0] >= args.nproc:
        raise ConfigError(f"--lose-rank={args.lose_rank}: rank {lose[0]} is not one of --nproc={args.nproc}'s ranks")
    return Elastic(lose, args.lost_at)


def _launch_elastic_groups(
    args: argparse.Namespace, cfg: RecipeConfig, groups: int, sets: list[str], elastic: Any
) -> int:
    """``--nproc N --elastic`` with replica groups that survive failures: one group fewer after each group lost."""
    from dataclasses import replace

    from bigtrain.cli.elastic_groups import launch_elastic_groups
    from bigtrain.config.resolve import resolve_plan

    per_group = args.nproc // groups
    own = ["-v"] * args.verbose + ["train", args.recipe, *sets]

    def check(n: int) -> None:
        resolve_plan(replace(cfg.parallel, dp_replicate=n), n * per_group, cfg.train)

    limits = (args.min_nproc, args.max_restarts, cfg.train.steps)
    return launch_elastic_groups(args.nproc, groups, own, cfg.output_dir, limits, elastic.lose, check)


def _probe(args: argparse.Namespace, env: LaunchEnv) -> int:
    from pathlib import Path

    output = Path(args.output).resolve() if args.output else None
    _check_nproc(args)
    if args.nproc is not None:
        from bigtrain.cli.launch import launch_local

        worker_args = ["-v"] * args.verbose + ["probe"] + (["-o", str(output)] if output else [])
        return launch_local(args.nproc, worker_args)
    from bigtrain.measure.probe import run_probe, summary

    if env.rank == 0:
        logging.getLogger("bigtrain").info(
            "probe: measuring matmuls, host copies%s (about 20 s on a CPU)", " and collectives" * env.launched
        )
    profile = run_probe(output)
    if env.rank == 0:
        print(summary(profile))
        if output is None:
            print(json.dumps(profile, indent=1))
        else:
            logging.getLogger("bigtrain").info("probe: profile written to %s (--hardware-profile %s)", output, output)
    return 0


def _recipe(args: argparse.Namespace) -> RecipeConfig:
    from bigtrain.config.load import load_recipe

    return load_recipe(args.recipe, args.overrides)


def _train(args: argparse.Namespace, cfg: RecipeConfig, env: LaunchEnv) -> int:
    from bigtrain.train.replica_groups import (
        GROUP_RESTARTS,
        ReplicaGroup,
        check_group_jobs,
        job_world,
        survives_failures,
    )

    _check_nproc(args)
    elastic = _elastic(args, env)
    group = None if args.replica_group is None else ReplicaGroup.of(args.replica_group, cfg)
    cfg = group.recipe(cfg) if group is not None else cfg
    if args.dry_run:
        from dataclasses import replace

        from bigtrain.train.run import TrainingJob

        world = args.nproc if args.nproc is not None else env.world_size
        ranks = replace(env, world_size=world, local_world_size=world if not env.launched else env.local_world_size)
        if env.rank == 0:
            print(TrainingJob(cfg, ranks).dry_run())
        return 0
    if args.nproc is not None:
        if env.launched:
            raise ConfigError(
                "--nproc starts its own workers; drop it when running under torchrun or accelerate launch"
            )
        from bigtrain.checkpoint.run_dir import plan_start
        from bigtrain.cli.launch import launch_local
        from bigtrain.config.resolve import resolve_plan
        from bigtrain.train.start_up import resolve

        plan = None
        if cfg.parallel.plan != "auto":  # fail here, before starting workers
            plan = resolve_plan(cfg.parallel, job_world(args.nproc, group), cfg.train)
        # a finished run (RunFinished) starts no workers; compared as the workers will, its objective resolved
        plan_start(resolve(cfg).cfg)
        sets = [a for o in args.overrides for a in ("--set", o)]
        if elastic is not None and group is None and plan is not None and survives_failures(plan):
            return _launch_elastic_groups(args, cfg, plan.dp_replicate, sets, elastic)
        if elastic is not None:
            from bigtrain.cli.elastic_launch import launch_elastic

            own = ["-v"] * args.verbose + ["train", args.recipe, *sets, "--quiet-failures"]
            return launch_elastic(
                args.nproc,
                own + (["--replica-group", str(group.index)] if group is not None else []),
                cfg.output_dir,
                args.min_nproc,
                args.max_restarts,
                elastic.lose,
                args.verbose,
                elastic.lost_at,
            )
        if group is None and plan is not None and survives_failures(plan):  # a job per replica group
            from bigtrain.cli.launch import launch_replica_groups

            own = ["-v"] * args.verbose + ["train", args.recipe, *sets]
            return launch_replica_groups(args.nproc, plan.dp_replicate, own, cfg.output_dir)
        worker_args = ["-v"] * args.verbose + ["train", args.recipe, *sets, "--quiet-failures"]
        worker_args += ["--replica-group", str(group.index)] if group is not None else []
        restarts = GROUP_RESTARTS if group is not None else 0
        return launch_local(args.nproc, worker_args, cfg.output_dir, args.verbose, max_restarts=restarts)
    from bigtrain.train.run import run_training

    if elastic is None:
        check_group_jobs(cfg, env.world_size, group)
    elif group is None and cfg.parallel.options.get("replica_failures") == "continue":  # its plan may not resolve
        raise ConfigError(
            "--elastic with parallel.replica_failures=continue starts each replica group as a job of its own: use "
            "bigtrain train --nproc N --elastic (one torchrun per group with --replica-group I is not elastic)"
        )
    result = run_training(cfg, group, elastic)
    if result.stopped and elastic is not None:  # a peer's node was stopped: the agent starts this one again
        from bigtrain.train.elastic import EXIT_STOPPED_EARLY

        return EXIT_STOPPED_EARLY
    return EXIT_AFTER[result.stopped] if result.stopped else 0
