"""SIGTERM (how schedulers announce preemption) and Ctrl-C (SIGINT) end the run at the next step boundary, after a
checkpoint; a second Ctrl-C stops at once.

The handler only sets a flag; the loop asks ``requested()`` once per step, which takes the maximum of the flag over
all ranks. A signal reaches ranks at slightly different moments, and a checkpoint is collective: the agreement makes
every rank stop after the same step. The cost is one one-element all-reduce per step.

Ctrl-C in a terminal reaches the launcher and every worker at once, and torch's elastic launcher then sends each
worker the same signal again while it shuts them down: a SIGINT within ``REPEAT_S`` of the first is that echo, not a
person pressing Ctrl-C twice.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("bigtrain")

REPEAT_S = 1.0  # a second SIGINT sooner than this after the first is the launcher's echo of it
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopOnSignal:
    """Context manager: installs the SIGTERM and SIGINT handlers (main thread only) and restores the previous ones
    on exit."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.received: signal.Signals | None = None  # the first stop signal received, on this rank
        self._first_sigint = 0.0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if signum == signal.SIGINT and self._first_sigint:
            if now - self._first_sigint >= REPEAT_S:
                raise KeyboardInterrupt  # a second Ctrl-C: stop at once
            return
        if signum == signal.SIGINT:
            self._first_sigint = now
        if self.received is None:
            self.received = signal.Signals(signum)

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def requested(self) -> signal.Signals | None:
        """The stop signal any rank has received, or None (collective: every rank calls it at the same step
        boundary). SIGINT wins over SIGTERM when ranks received different ones."""
        code = {None: 0, signal.SIGTERM: 1, signal.SIGINT: 2}[self.received]
        flag = torch.tensor([code], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return {0: None, 1: signal.SIGTERM, 2: signal.SIGINT}[int(flag.item())]
