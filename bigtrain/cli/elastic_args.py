"""``bigtrain train``'s elastic flags (docs/elastic.md), kept apart from the launcher so that parsing imports no
part of torch's elastic agent."""

from __future__ import annotations

import argparse


def add_elastic_arguments(train: argparse.ArgumentParser) -> None:
    train.add_argument(
        "--elastic",
        action="store_true",
        help="keep training when ranks are lost: start again on the ones that remain, re-planned where the recipe's "
        "plan does not run on them, from the newest good checkpoint (with --nproc, or under torchrun --nnodes "
        "MIN:MAX; docs/elastic.md)",
    )
    train.add_argument(
        "--min-nproc", type=int, default=1, metavar="M", help="with --elastic --nproc: stop when fewer ranks remain"
    )
    train.add_argument(
        "--max-restarts", type=int, default=3, metavar="R", help="with --elastic --nproc: start again at most R times"
    )
    train.add_argument(
        "--lose-rank",
        default=None,
        metavar="R@STEP",
        help="with --elastic: a drill, rank R leaves for good before step STEP, as if its GPU were gone",
    )
    train.add_argument(
        "--mtbf",
        type=float,
        default=None,
        metavar="HOURS",
        help="the job's mean time between failures, for checkpoint.every: auto (the same as --set "
        "checkpoint.mtbf_hours=HOURS; unset: one GPU's checkpoint.gpu_mtbf_hours over the job's GPUs)",
    )
    # set by the elastic launcher for its workers: when it saw the last loss (the re-plan line's restart time)
    train.add_argument("--lost-at", type=float, default=None, help=argparse.SUPPRESS)
