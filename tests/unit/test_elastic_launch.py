"""What the elastic launcher takes out after a failed attempt (cli/elastic_launch.py): a lost device at once; a rank
that fails otherwise twice in a row; never the ranks a failure only stopped; a bad-input line is not a loss."""

from __future__ import annotations

import json
import signal
from collections import Counter

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from bigtrain.cli.elastic_launch import SLOT_TRIES, _gone, _input_failure, _what_happened
from bigtrain.cli.failures import EXIT_LOST_RANK
from bigtrain.train.elastic import EXIT_DEVICE_GONE


def failure(local_rank: int, exitcode: int, tmp_path, line: str | None = None, code: int = 2) -> ProcessFailure:
    error_file = tmp_path / f"error{local_rank}.json"
    if line is not None:  # what a worker's cli/failures.say writes for the launcher
        info = {"timestamp": "0", "exitcode": str(code)}
        error_file.write_text(json.dumps({"message": {"message": line, "extraInfo": info}}))
    return ProcessFailure(local_rank, 1000 + local_rank, exitcode, str(error_file))


def test_a_lost_device_is_taken_out_at_once_and_its_peers_are_not(tmp_path):
    slots, strikes = [0, 1, 2, 3], Counter()
    failures = {3: failure(3, EXIT_DEVICE_GONE, tmp_path), 0: failure(0, EXIT_LOST_RANK, tmp_path)}
    failures[1] = failure(1, -signal.SIGTERM, tmp_path)
    assert _gone(failures, slots, strikes) == {3}
    assert _what_happened(failures, slots, {3}) == "lost rank 3 (device 3) for good"
    # the slots are devices: after a loss, rank 1 of [0, 2, 3] stands on device 2
    assert _gone({1: failure(1, EXIT_DEVICE_GONE, tmp_path)}, [0, 2, 3], Counter()) == {2}


def test_a_rank_that_fails_again_each_time_is_taken_out_after_the_tries(tmp_path):
    slots, strikes = [0, 1], Counter()
    crashed = {1: failure(1, -signal.SIGKILL, tmp_path), 0: failure(0, EXIT_LOST_RANK, tmp_path)}
    for attempt in range(1, SLOT_TRIES):
        assert _gone(crashed, slots, strikes) == set(), attempt
        assert _what_happened(crashed, slots, set()) == "rank 1 failed (killed by SIGKILL)"
    assert _gone(crashed, slots, strikes) == {1}
    strikes = Counter({1: SLOT_TRIES - 1})  # a success in between starts the count again
    assert _gone({0: failure(0, 1, tmp_path)}, slots, strikes) == set() and strikes[1] == 0


def test_bad_input_is_the_run_s_stop_not_a_loss(tmp_path):
    said = failure(0, 2, tmp_path, line="error: train.lr=0 would leave the model as it is")
    assert _input_failure({0: said}) == "error: train.lr=0 would leave the model as it is"
    lost = failure(0, EXIT_LOST_RANK, tmp_path, line="error: lost contact with another rank", code=EXIT_LOST_RANK)
    assert _input_failure({0: lost}) is None


def test_the_ranks_the_agent_stops_after_the_first_death_are_not_blamed(tmp_path):
    """NCCL ranks stuck with the dead one are SIGKILLed by the agent after its grace period: recorded later."""
    dead = failure(3, -signal.SIGKILL, tmp_path)
    stuck = {rank: failure(rank, -signal.SIGKILL, tmp_path) for rank in range(3)}
    for f in stuck.values():
        f.timestamp = dead.timestamp + 30
    strikes: Counter[int] = Counter()
    for _ in range(SLOT_TRIES):
        gone = _gone({3: dead, **stuck}, [0, 1, 2, 3], strikes)
    assert gone == {3} and strikes[0] == strikes[1] == strikes[2] == 0


def test_a_worker_that_raises_is_tried_again_not_taken_out(tmp_path):
    """A Python error (exit 1) twice is a bug to see, not a device to drop: the run stops at --max-restarts."""
    strikes: Counter[int] = Counter()
    for _ in range(SLOT_TRIES + 1):
        assert _gone({0: failure(0, 1, tmp_path)}, [0, 1], strikes) == set()


def _groups_launcher(monkeypatch, outcomes: list[list[int]], asked: bool = False) -> list[list[list[str]]]:
    """launch_elastic_groups with each attempt's exit codes given: the arguments each group got."""
    from bigtrain.cli import elastic_groups

    seen: list[list[list[str]]] = []

    def attempt(per_group, groups, args_of, output_dir, devices=None, lost_code=None):
        assert lost_code == EXIT_DEVICE_GONE and devices is None  # no GPU here
        seen.append([args_of(i) for i in range(groups)])
        return outcomes[len(seen) - 1], asked

    monkeypatch.setattr(elastic_groups, "run_replica_groups", attempt)
    return seen


STEPS = 30


def test_a_group_that_cannot_come_back_whole_starts_the_run_again_as_one_group_fewer(tmp_path, monkeypatch, capfd):
    from bigtrain.cli.elastic_groups import launch_elastic_groups

    seen = _groups_launcher(monkeypatch, [[0, 0, EXIT_DEVICE_GONE], [0, 0]])
    code = launch_elastic_groups(6, 3, ["train", "r.yaml"], str(tmp_path), (1, 3, STEPS), (5, 12), lambda n: None)
    assert code == 0 and len(seen) == 2
    first, second = seen
    assert first[2][-2:] == ["--lose-rank", "1@12"] and "--lose-rank" not in first[0]  # rank 5: group 2's rank 1
    assert all(["--set", "parallel.dp_replicate=2"] == args[2:4] for args in second)
    assert all("--lost-at" in args and "--lose-rank" not in args for args in second)
    assert all(args[args.index("--min-nproc") + 1] == "2" for args in first + second)  # a group is whole or lost
    err = capfd.readouterr().err
    assert "elastic: replica group 2 (rank(s) 4-5) cannot come back whole; the other groups were stopped " in err
    assert "starting again as 2 group(s) of 2 rank(s), the global batch kept, restart 1 of at most 3" in err


def test_two_groups_lost_together_leave_two_fewer(tmp_path, monkeypatch, capfd):
    from bigtrain.cli.elastic_groups import launch_elastic_groups

    seen = _groups_launcher(monkeypatch, [[0, EXIT_DEVICE_GONE, 0, EXIT_DEVICE_GONE], [0, 0]])
    assert launch_elastic_groups(4, 4, ["train"], str(tmp_path), (1, 3, STEPS), None, lambda n: None) == 0
    assert len(seen[1]) == 2 and all(["--set", "parallel.dp_replicate=2"] == args[1:3] for args in seen[1])
    assert "replica group 1 (rank 1); replica group 3 (rank 3) cannot come back whole" in capfd.readouterr().err


def test_a_group_lost_after_the_others_finished_the_run_is_the_run_s_end(tmp_path, monkeypatch, capfd):
    from bigtrain.cli.elastic_groups import launch_elastic_groups

    last = tmp_path / "checkpoints" / f"step_{STEPS}"
    last.mkdir(parents=True)
    (last / "bigtrain.json").write_text("{}")
    (last / ".metadata").write_text("")
    seen = _groups_launcher(monkeypatch, [[0, EXIT_DEVICE_GONE]])
    assert launch_elastic_groups(2, 2, ["train"], str(tmp_path), (1, 3, STEPS), None, lambda n: None) == 0
    assert len(seen) == 1  # nothing started again
    assert "elastic: replica group 1 (rank 1) cannot come back whole; the other groups finished the run" in (
        capfd.readouterr().err
    )


def test_a_stop_asked_of_the_launcher_is_the_run_s_stop_not_a_loss(tmp_path, monkeypatch):
    from bigtrain.cli.elastic_groups import launch_elastic_groups

    seen = _groups_launcher(monkeypatch, [[0, EXIT_DEVICE_GONE, 0]], asked=True)
    assert launch_elastic_groups(3, 3, ["train"], str(tmp_path), (1, 3, STEPS), None, lambda n: None) == 0
    assert len(seen) == 1


def test_where_fewer_groups_cannot_go_on_the_run_stops_in_one_line(tmp_path, monkeypatch, capfd):
    from bigtrain.cli.elastic_groups import launch_elastic_groups
    from bigtrain.errors import ConfigError

    def refuse(n):
        raise ConfigError(f"train.global_batch_size=16 does not split over {n} groups; try 2 or 4")

    cases = [
        (2, (1, 3, STEPS), lambda n: None, "one group remains, and groups that survive failures need two"),
        (3, (3, 3, STEPS), lambda n: None, "2 rank(s) remain, fewer than --min-nproc=3"),
        (3, (1, 0, STEPS), lambda n: None, "--max-restarts=0 reached"),
        (3, (1, 3, STEPS), refuse, "the recipe's plan does not run as 2 groups (train.global_batch_size=16 does not"),
    ]
    for groups, limits, check, words in cases:
        _groups_launcher(monkeypatch, [[0] * (groups - 1) + [EXIT_DEVICE_GONE]])
        assert launch_elastic_groups(groups, groups, ["train"], str(tmp_path), limits, None, check) == EXIT_DEVICE_GONE
        (line,) = [line for line in capfd.readouterr().err.splitlines() if line.startswith("bigtrain: error: ")]
        assert words in line and "no checkpoint was written yet" in line, line


def test_a_group_that_fails_otherwise_is_said_as_without_elastic(tmp_path, monkeypatch, capfd):
    from bigtrain.cli.elastic_groups import launch_elastic_groups

    _groups_launcher(monkeypatch, [[0, 2]])
    assert launch_elastic_groups(2, 2, ["train"], str(tmp_path), (1, 3, STEPS), None, lambda n: None) == 2
    assert "replica group 1 exited with code 2" in capfd.readouterr().err
