"""When replica groups that are jobs of their own (torchft) stop on a signal: together after the next
synchronisation when it is near at their pace, else at once (``ReplicaSyncEngine.stop_here``)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
import torch

from bigtrain.config.capabilities.replica_sync import SyncSettings
from bigtrain.engine.replica_links import TorchftLink
from bigtrain.engine.replica_sync import STOP_WAIT_S, ReplicaSyncEngine


def _engine(steps: int, step_s: float, every: int = 10, fragments: int = 1, delay: int = 0, total: int = 100):
    settings = SyncSettings("diloco", every, 0.7, 0.9, fragments, delay, "fp32", "host")
    engine = SimpleNamespace(
        link=TorchftLink(0, 2, torch.device("cpu"), 10.0),  # no Manager: nothing is started until attach
        settings=settings, steps=steps, total_steps=total, _step_s=step_s, _stop_asked=None, _stop_agreed=False,
    )  # fmt: skip
    engine._steps_to_stop_point = lambda: ReplicaSyncEngine._steps_to_stop_point(engine)
    return engine


@pytest.mark.parametrize(
    "steps, every, fragments, delay, total, expected",
    [(12, 10, 1, 0, 100, 8), (20, 10, 1, 0, 100, 10), (12, 10, 1, 0, 15, 3), (12, 10, 2, 2, 100, 3)],
    ids=["next-multiple", "just-synchronised", "the-last-step-first", "streaming-fragment-and-delay"],
)
def test_a_stop_takes_effect_when_the_next_send_is_applied(steps, every, fragments, delay, total, expected):
    # streaming: fragment 0 is due at step 5 (mod 10) and sent 2 steps before, at 13, then applied at 15
    engine = _engine(steps, 1.0, every, fragments, delay, total)
    assert ReplicaSyncEngine._steps_to_stop_point(engine) == expected


def test_a_near_synchronisation_is_waited_for_and_a_far_one_is_not():
    near = _engine(steps=12, step_s=STOP_WAIT_S / 10)  # 8 steps to go: within the wait
    assert ReplicaSyncEngine.stop_here(near, signal.SIGTERM) is None
    assert near._stop_asked == signal.SIGTERM  # carried by the next send
    near._stop_agreed = True  # that synchronisation carried it (``_apply``)
    assert ReplicaSyncEngine.stop_here(near, None) == signal.SIGTERM
    far = _engine(steps=12, step_s=STOP_WAIT_S / 4)  # 8 steps at a quarter of the wait each: stops at once, alone
    assert ReplicaSyncEngine.stop_here(far, signal.SIGTERM) == signal.SIGTERM


def test_a_group_that_received_nothing_stops_with_the_others_after_the_synchronisation():
    engine = _engine(steps=20, step_s=1.0)
    assert ReplicaSyncEngine.stop_here(engine, None) is None
    engine._stop_agreed = True
    assert ReplicaSyncEngine.stop_here(engine, None) == signal.SIGTERM
