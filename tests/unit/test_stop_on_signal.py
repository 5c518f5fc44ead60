"""Ctrl-C once: stop after the step (a flag); the launcher's echo of the same Ctrl-C within REPEAT_S: ignored; a
second Ctrl-C later: stop at once (KeyboardInterrupt). SIGTERM: the flag. Signals sent to this process for real."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from bigtrain.train import preemption
from bigtrain.train.preemption import StopOnSignal


def _send(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # the handler runs at the next bytecode boundary of the main thread


def test_ctrl_c_sets_the_flag_its_echo_is_ignored_and_a_second_one_stops_at_once(monkeypatch):
    monkeypatch.setattr(preemption, "REPEAT_S", 0.3)
    before = signal.getsignal(signal.SIGINT)
    with StopOnSignal(torch.device("cpu")) as stop:
        _send(signal.SIGINT)
        assert stop.received is signal.SIGINT
        _send(signal.SIGINT)  # within REPEAT_S: the launcher passing the same Ctrl-C on
        time.sleep(0.3)
        with pytest.raises(KeyboardInterrupt):
            _send(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back


def test_sigterm_sets_the_flag_and_never_interrupts():
    with StopOnSignal(torch.device("cpu")) as stop:
        _send(signal.SIGTERM)
        _send(signal.SIGTERM)
        assert stop.received is signal.SIGTERM
