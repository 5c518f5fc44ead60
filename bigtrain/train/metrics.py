"""What a run reports: ``metrics.jsonl`` (one object per optimizer step), a tracker's records when asked
(``trackers.py``), ``plan.json``, progress bar and summary."""

from __future__ import annotations

import json
import math
import resource
import sys
from pathlib import Path
from typing import Any

import torch

from bigtrain.config.plan import Plan
from bigtrain.train.trackers import Tracker, numbers


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """Peak memory of this rank and what it measures: CUDA allocator peak on GPU, process peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    # ru_maxrss is in KiB on Linux: the whole process (Python, libraries, tensors), an upper bound on tensor memory.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak RSS"


class MetricsWriter:
    """Writes metrics.jsonl and plan.json (rank 0 only; other ranks hold a disabled writer).

    A resumed run keeps the records up to the step it resumed from and appends; records of steps after that
    checkpoint (trained, then lost with the crash) are dropped, so every step appears once.
    """

    def __init__(
        self, output_dir: str, enabled: bool, keep_through_step: int = 0, tracker: Tracker | None = None
    ) -> None:
        self.enabled = enabled
        self.dir = Path(output_dir)
        self._file = None
        self._tracker = tracker if enabled else None
        if enabled:
            self.dir.mkdir(parents=True, exist_ok=True)
            path = self.dir / "metrics.jsonl"
            kept = _records_through(path, keep_through_step) if keep_through_step > 0 else []
            partial = path.with_name(path.name + ".partial")
            partial.write_text("".join(line + "\n" for line in kept))
            partial.replace(path)  # atomic: a crash here leaves the old file or the new one
            self._file = path.open("a")

    def write_plan(self, plan: Plan) -> None:
        if self.enabled:
            (self.dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")

    def log_step(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            # standard JSON: NaN and infinities (a diverged step) are written as null, which every parser reads
            clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
            self._file.write(json.dumps(clean, allow_nan=False) + "\n")
            self._file.flush()
        if self._tracker is not None:
            self._tracker.log(numbers(record), record["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tracker is not None:
            self._tracker.close()


def _records_through(path: Path, step: int) -> list[str]:
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # empty, or cut short by a crash
        if record.get("step", 0) <= step:
            kept.append(line)
    return kept


class Progress:
    """A tqdm bar on rank 0 with step, loss, throughput (tokens/s, images/s or examples/s: ``unit``), the latest
    evaluation loss and the job's ``shown`` metrics (``Job.shown_metrics``: a classifier's accuracy and macro-F1, a
    preference objective's reward accuracy and margins), and ETA (tqdm computes the ETA from the step rate)."""

    def __init__(
        self, total: int, initial: int, enabled: bool, unit: str = "tokens", shown: tuple[str, ...] = ()
    ) -> None:
        self._bar = None
        self._unit = unit
        self._rate = {"tokens": "tok_s", "images": "img_s", "examples": "ex_s"}.get(unit, f"{unit}_s")
        self._shown = ("eval_loss", *shown)
        # each shown metric's latest value: an evaluation stays in view until the next
        self.latest: dict[str, float] = {}
        self._lines: Any = None
        if enabled:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            # lines logged while the bar shows (a checkpoint saved, an evaluation) go above it, not into it
            self._lines = logging_redirect_tqdm()
            self._lines.__enter__()
            self._bar = tqdm(
                total=total,
                initial=initial,
                desc="train",
                unit="step",
                file=sys.stderr,
                mininterval=0.5,
                dynamic_ncols=True,
            )

    def update(self, record: dict[str, Any]) -> None:
        """One step's record (what metrics.jsonl gets)."""
        self.latest.update({k: float(record[k]) for k in self._shown if isinstance(record.get(k), int | float)})
        if self._bar is not None:
            shown = {"loss": f"{record['loss']:.4f}", self._rate: f"{record[f'{self._unit}_per_s']:,.0f}"}
            shown.update({name: f"{value:.4g}" for name, value in self.latest.items()})
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._lines is not None:
            self._lines.__exit__(None, None, None)
            self._lines = None


def format_bytes(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"
