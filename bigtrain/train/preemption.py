"""SIGTERM (how schedulers announce preemption) ends the run at the next step boundary, after a checkpoint.

The handler only sets a flag; the loop asks ``requested()`` once per step, which takes the maximum of the flag over
all ranks. A scheduler's signal reaches ranks at slightly different moments, and a checkpoint is collective: the
agreement makes every rank stop after the same step. The cost is one one-element all-reduce per step.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("bigtrain")


class StopOnSigterm:
    """Context manager: installs the SIGTERM handler (main thread only) and restores the previous one on exit."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._signalled = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = True

    def __enter__(self) -> StopOnSigterm:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def requested(self) -> bool:
        """Whether any rank has received SIGTERM (collective: every rank calls it at the same step boundary)."""
        flag = torch.tensor([int(self._signalled)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
