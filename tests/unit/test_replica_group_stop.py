"""Replica groups that are jobs of their own (torchft) in an elastic run: they stop on a signal together after the
next synchronisation when it is near at their pace, else at once (``ReplicaSyncEngine.stop_here``); the re-plan
line after they start again as fewer groups."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from bigtrain.config.capabilities.replica_sync import SyncSettings
from bigtrain.engine.replica_links import TorchftLink
from bigtrain.engine.replica_sync import STOP_WAIT_S, ReplicaSyncEngine


@pytest.fixture
def one_rank(tmp_path):
    """A process group of this process alone (the group's ranks agree on stopping alone by an all-reduce)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _engine(
    steps: int, step_s: float, every: int = 10, fragments: int = 1, delay: int = 0, total: int = 100, joint=True
):
    settings = SyncSettings("diloco", every, 0.7, 0.9, fragments, delay, "fp32", "host")
    engine = SimpleNamespace(
        link=TorchftLink(0, 2, torch.device("cpu"), 10.0, joint_stop=joint),  # no Manager until attach
        settings=settings, steps=steps, total_steps=total, _step_s=step_s, _stop_asked=None, _stop_agreed=False,
        _stop_alone=False, device=torch.device("cpu"), replica=0,
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


def test_a_near_synchronisation_is_waited_for_and_a_far_one_is_not(one_rank):
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


def test_outside_an_elastic_run_a_signalled_group_stops_alone_at_once():
    engine = _engine(steps=12, step_s=0.1, joint=False)  # the next synchronisation is near, yet not waited for
    assert ReplicaSyncEngine.stop_here(engine, signal.SIGTERM) == signal.SIGTERM
    assert ReplicaSyncEngine.stop_here(engine, None) is None and engine._stop_asked is None  # nothing sent


def test_the_re_plan_line_counts_every_group_s_ranks_and_the_steps_the_other_groups_went_on(tmp_path):
    """Replica groups that are jobs of their own save with one group's world (and the whole plan); the line compares
    the runs' worlds, and the steps lost count what the other groups logged after group 0's checkpoint."""
    from helpers import make_plan

    from bigtrain.train.elastic import replan_line

    options = {"sync": "diloco", "replica_failures": "continue"}
    before = make_plan(backend="ddp", zero_stage=0, dp_replicate=3, **options)
    after = make_plan(backend="ddp", zero_stage=0, dp_replicate=2, **options)
    saved = SimpleNamespace(world_size=1, plan=before.to_dict(), step=10)
    (tmp_path / "metrics.jsonl").write_text('{"step": 11}\n')
    (tmp_path / "replica_groups" / "group1").mkdir(parents=True)
    (tmp_path / "replica_groups" / "group1" / "metrics.jsonl").write_text('{"step": 19}\n{"step": 20}\n')
    line = replan_line(saved, after, 2, lambda plan, world=2: f"{world} ranks", None, str(tmp_path))
    assert line is not None and line.startswith("elastic: 3 -> 2 rank(s): plan ddp ")
    assert "(3 ranks) -> ddp" in line and "resumed at step 10, 10 step(s) lost since that checkpoint" in line
    same = SimpleNamespace(world_size=1, plan=after.to_dict(), step=10)
    assert replan_line(same, after, 2, lambda plan, world=2: "", None, str(tmp_path)) is None
