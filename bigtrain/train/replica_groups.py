"""Replica groups that survive a failure (``parallel.replica_failures: continue``): each group a job of its own.

A semi-synchronous plan of R replica groups (``parallel.dp_replicate``) runs as R torch.distributed jobs (one
torchrun each, the ``--nproc`` launcher starts them with torchft's Lighthouse, ``cli/launch.py``), joined by torchft
(``engine/replica_links.TorchftLink``). Each job builds the plan's one group (dp_replicate 1) and reads its group's
share of every global batch. Group 0 owns the run's output_dir (metrics, checkpoints, the final model); group i > 0
writes into ``output_dir/replica_groups/group<i>`` and never resumes from a checkpoint: when it starts, restarted or
with the job, it takes a healthy group's state at its first quorum.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from bigtrain.config.capabilities.replica_sync import REPLICA_FAILURES
from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.engine.replica_links import TorchftLink
from bigtrain.errors import ConfigError
from bigtrain.parallel.transforms.base import BuildOptions

GROUPS_FOLDER = "replica_groups"
# how often a replica group's workers are started again after one of them died (with --elastic, a rank whose device
# is gone, or that was killed twice in a row, ends the group's tries at once: cli/elastic_launch.py)
GROUP_RESTARTS = 3


def survives_failures(plan: Plan) -> bool:
    return REPLICA_FAILURES.of(plan) == "continue"


def group_output_dir(output_dir: str, index: int) -> str:
    return output_dir if index == 0 else str(Path(output_dir) / GROUPS_FOLDER / f"group{index}")


@dataclass(frozen=True)
class ReplicaGroup:
    """This job's place among the run's replica groups (``--replica-group``, set by the launcher)."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"replica group {self.index} of {self.count}"

    @classmethod
    def of(cls, index: int, cfg: RecipeConfig) -> ReplicaGroup:
        count = cfg.parallel.dp_replicate
        if cfg.parallel.plan == "auto" or count is None or count < 2 or not 0 <= index < count:
            raise ConfigError(
                f"--replica-group {index} needs a written plan with parallel.dp_replicate >= 2 groups (it has "
                f"{count}) and parallel.replica_failures=continue; it is set by bigtrain train --nproc"
            )
        return cls(index, count)

    def recipe(self, cfg: RecipeConfig) -> RecipeConfig:
        """Group 0's recipe is the run's; another group's writes apart and starts from a healthy group's state."""
        if self.index == 0:
            return cfg
        checkpoint = dataclasses.replace(cfg.checkpoint, resume=False, every=0, save_final_model=False)
        return dataclasses.replace(cfg, output_dir=group_output_dir(cfg.output_dir, self.index), checkpoint=checkpoint)

    def options(self, options: BuildOptions, timeout_s: float, elastic: bool = False) -> BuildOptions:
        """The build of this group alone (dp_replicate 1), joined to the others by torchft (``elastic``: the groups
        stop together on a signal, ``ReplicaSyncEngine.stop_here``)."""
        link = TorchftLink(self.index, self.count, options.device, timeout_s, joint_stop=elastic)
        return dataclasses.replace(options, plan=options.plan.but(dp_replicate=1), replicas=link)


def job_world(group_world: int, group: ReplicaGroup | None) -> int:
    """The ranks of the whole run: this job's, times the groups when each group is a job."""
    return group_world * (group.count if group is not None else 1)


def check_group_jobs(cfg: RecipeConfig, group_world: int, group: ReplicaGroup | None) -> None:
    """A plan whose replica groups survive failures runs one job per group: refused as one job of them all."""
    if group is not None or cfg.parallel.plan == "auto":
        return
    from bigtrain.config.resolve import resolve_plan

    if survives_failures(resolve_plan(cfg.parallel, group_world, cfg.train)):
        raise ConfigError(
            "parallel.replica_failures=continue runs each replica group as a job of its own: start the run with "
            "bigtrain train --nproc N, or one torchrun per group with --replica-group I and torchft's Lighthouse "
            "(docs/slow-links.md)"
        )
