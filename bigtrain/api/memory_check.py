"""The planner's memory prediction against the device's measured peak, inside the user's own run.

``check_memory(result)`` is for an accelerate (or any) loop: call it after the first steps on each rank; it reads
this rank's peak and logs both numbers. ``MemoryCheckCallback(result)`` does the same for HF ``Trainer`` / TRL after
``after_steps`` optimizer steps, logging the line through transformers' logger (shown with the Trainer's own lines
under ``TrainingArguments(log_level="info")``; a gap beyond the stated error is a warning, shown by default) and adding
it to ``trainer.state.log_history``.

On a GPU the measured figure is ``torch.cuda.max_memory_allocated`` (what the planner predicts: tensor memory, the
CUDA context and allocator slack excluded) and a gap beyond the planner's stated error (10%, docs/accuracy.md) is a
warning. On a CPU there is no tensor-memory counter: the line shows the process's peak RSS, an upper bound that
holds Python and its libraries too, and makes no comparison. The plan was predicted for bigtrain's own training
step; another trainer running the same plan may differ, which is what this line shows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.utils import logging as hf_logging

from bigtrain.train.metrics import peak_memory_bytes

log = logging.getLogger("bigtrain")

# a child of transformers' root logger: its handler and the verbosity the Trainer sets from log_level
TRAINER_LOG = hf_logging.get_logger("transformers.bigtrain")
STATED_ERROR = 0.10  # the planner's memory error bound (docs/accuracy.md: every simulated case within 10%)


@dataclass(frozen=True)
class MemoryCheck:
    """One rank's measured peak beside the plan's prediction."""

    predicted_bytes: int
    measured_bytes: int
    measures: str  # what measured_bytes is: "torch.cuda.max_memory_allocated" or "peak RSS"
    tolerance: float

    @property
    def compared(self) -> bool:
        """Whether the two numbers measure the same thing (a CUDA device's tensor memory)."""
        return self.measures == "torch.cuda.max_memory_allocated"

    @property
    def relative_error(self) -> float | None:
        """(predicted - measured) / measured, on a GPU; None on a CPU."""
        if not self.compared or not self.measured_bytes:
            return None
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes

    @property
    def within_tolerance(self) -> bool | None:
        error = self.relative_error
        return None if error is None else abs(error) <= self.tolerance

    def line(self) -> str:
        head = (
            f"bigtrain memory check: predicted peak {_gib(self.predicted_bytes)}, measured {_gib(self.measured_bytes)} "
            f"({self.measures})"
        )
        error = self.relative_error
        if error is None:
            return head + "; not compared: on a CPU the process's peak RSS holds Python and its libraries too"
        verdict = "within" if abs(error) <= self.tolerance else "beyond"
        return head + f"; prediction {error:+.1%} of measured, {verdict} the planner's stated {self.tolerance:.0%}"


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB"


def measured_peak(device: torch.device | str | None = None) -> tuple[int, str]:
    """This rank's peak memory and what it measures: the CUDA allocator's peak on a GPU, the peak RSS on a CPU."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    return peak_memory_bytes(torch.device(device))  # what bigtrain train's metrics record


def _predicted(prediction: Any) -> int:
    """Bytes from a PlanResult (its predicted peak) or a number."""
    peak = getattr(prediction, "predicted_peak_bytes", prediction)
    if not isinstance(peak, int) or peak <= 0:
        raise TypeError(f"prediction must be a bigtrain PlanResult or a positive byte count, not {prediction!r}")
    return peak


def check_memory(
    prediction: Any,
    device: torch.device | str | None = None,
    tolerance: float = STATED_ERROR,
    logs: bool = True,
    logger: logging.Logger = log,
) -> MemoryCheck:
    """Compare this rank's measured peak with ``prediction`` (a ``PlanResult`` or bytes) and log the line (a
    warning when a GPU's figure is beyond ``tolerance``). Local to this rank: no collective, call it on any rank.
    The peak counts since the process started or since ``torch.cuda.reset_peak_memory_stats`` (call that before
    the first step to leave model loading out)."""
    measured, measures = measured_peak(device)
    check = MemoryCheck(_predicted(prediction), measured, measures, tolerance)
    if logs:
        level = logging.WARNING if check.within_tolerance is False else logging.INFO
        logger.log(level, check.line())
    return check


class MemoryCheckCallback(TrainerCallback):
    """``Trainer(callbacks=[MemoryCheckCallback(result)])``: after ``after_steps`` optimizer steps, the measured
    peak beside the plan's prediction, logged by the main process and added to ``state.log_history`` as
    ``bigtrain/predicted_peak_bytes`` and ``bigtrain/measured_peak_bytes``; ``callback.check`` holds it on every
    rank."""

    def __init__(self, prediction: Any, after_steps: int = 2, tolerance: float = STATED_ERROR) -> None:
        if after_steps < 1:
            raise ValueError(f"after_steps={after_steps} must be at least 1")
        self.predicted = _predicted(prediction)
        self.after_steps = after_steps
        self.tolerance = tolerance
        self.check: MemoryCheck | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # the peak of training, not of loading: what is allocated now (the model, its shards) stays counted
        device = getattr(args, "device", None)
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.check is not None or state.global_step < self.after_steps:
            return control
        device = getattr(args, "device", None)
        # through transformers' logger, as the Trainer's own lines: TrainingArguments(log_level="info") shows it
        self.check = check_memory(
            self.predicted, device, self.tolerance, logs=state.is_world_process_zero, logger=TRAINER_LOG
        )
        if state.is_world_process_zero:
            state.log_history.append(
                {
                    "bigtrain/predicted_peak_bytes": self.check.predicted_bytes,
                    "bigtrain/measured_peak_bytes": self.check.measured_bytes,
                    "bigtrain/measures": self.check.measures,
                    "bigtrain/relative_error": self.check.relative_error,
                    "step": state.global_step,
                }
            )
        return control
