"""When checkpoints are saved: every ``checkpoint.every`` steps, or, with ``every: auto``, at the interval that
minimises the time a failure is expected to cost.

Young's and Daly's first-order optimum for a save that pauses training for δ seconds and a mean time between
failures M is an interval of √(2·δ·M) seconds: shorter, the run spends more time saving; longer, a failure loses
more steps. With ``auto`` the first checkpoint comes ``PROBE_STEPS`` steps after the start; its save time (what the
step waited for: the whole write, or with ``checkpoint.async`` the copy to host memory) and the median step time
so far, the largest of every rank's, set the interval in steps, said in one line. M is ``checkpoint.mtbf_hours``,
else one GPU's ``checkpoint.gpu_mtbf_hours`` over the job's GPUs (a job of N GPUs fails N times as often).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Any

log = logging.getLogger("bigtrain")

PROBE_STEPS = 10  # with every: auto, the first checkpoint this many steps after the start measures the save


def young_daly_steps(save_s: float, step_s: float, mtbf_s: float) -> int:
    """The interval √(2·save·MTBF) in whole steps (at least 1)."""
    return max(1, round(math.sqrt(2 * save_s * mtbf_s) / step_s))


def job_mtbf_hours(checkpoint: Any, gpus: int) -> float:
    """The job's mean time between failures: ``mtbf_hours``, else one GPU's over the job's GPUs."""
    return checkpoint.mtbf_hours if checkpoint.mtbf_hours is not None else checkpoint.gpu_mtbf_hours / gpus


class Cadence:
    """``due(step)``: whether a checkpoint is saved after ``step``; ``stepped()`` at every step boundary and
    ``saved(seconds)`` after each save let ``auto`` measure what it needs."""

    def __init__(self, checkpoint: Any, gpus: int, device: Any, is_main: bool) -> None:
        self.every: int | None = None if checkpoint.every == "auto" else checkpoint.every
        self.mtbf_h = job_mtbf_hours(checkpoint, gpus)
        self.given = checkpoint.mtbf_hours is not None
        self.gpus = gpus
        self.probe: int | None = None  # the start's first step + PROBE_STEPS - 1 (set by the first step asked)
        self.device, self.is_main = device, is_main
        self._boundaries: list[float] = []

    def stepped(self) -> None:
        if self.every is None:
            self._boundaries.append(time.perf_counter())

    def due(self, step: int) -> bool:
        if self.every is None:
            self.probe = self.probe or step + PROBE_STEPS - 1
            return step == self.probe
        return self.every > 0 and step % self.every == 0

    def saved(self, seconds: float) -> None:
        """After a save that took ``seconds`` of the loop's time: with ``auto``, the first sets the interval
        (collective: every rank saves at the same step)."""
        if self.every is not None:
            return
        import torch
        import torch.distributed as dist

        times = [b - a for a, b in zip(self._boundaries, self._boundaries[1:], strict=False)]
        step_s = statistics.median(times) if times else seconds
        measured = torch.tensor([seconds, step_s], dtype=torch.float64, device=self.device)
        dist.all_reduce(measured, op=dist.ReduceOp.MAX)  # the slowest rank's: every rank decides the same
        save_s, step_s = (float(v) for v in measured.cpu())
        self.every = young_daly_steps(save_s, step_s, self.mtbf_h * 3600)
        if self.is_main:
            interval = math.sqrt(2 * save_s * self.mtbf_h * 3600)
            log.info(
                # three significant figures: the interval the line states follows from its numbers within 1%
                "checkpoint.every auto: every %d steps: a save takes %.3g s and a step %.3g s; MTBF %.3g h (%s); "
                "Young/Daly's interval sqrt(2 x %.3g s x %.3g h) = %.3g s",
                self.every, save_s, step_s, self.mtbf_h, self._mtbf_source(), save_s, self.mtbf_h, interval,
            )  # fmt: skip

    def _mtbf_source(self) -> str:
        return "checkpoint.mtbf_hours" if self.given else f"{self.gpus} GPU(s) at checkpoint.gpu_mtbf_hours each"
