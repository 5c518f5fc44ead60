"""A collective that fails for want of another rank is told apart from this rank's own problem, wherever it surfaces:
raised by gloo directly, or inside DCP's CheckpointException in the middle of a save (which would otherwise be
reported as a checkpoint the disk could not take)."""

from __future__ import annotations

import traceback

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from bigtrain.checkpoint.saver import Checkpointer
from bigtrain.errors import CheckpointNotWritten, no_answer, peer_failure

TIMED_OUT = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 8000ms for recv operation")
RESET = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242")


def _in_a_save(error: BaseException) -> CheckpointException:
    return CheckpointException("save failed", {0: (error, traceback.StackSummary())})


def test_a_peer_that_died_or_stopped_answering_is_found_in_the_error_or_inside_dcp_s():
    assert peer_failure(TIMED_OUT) is TIMED_OUT and no_answer(TIMED_OUT)
    assert peer_failure(RESET) is RESET and not no_answer(RESET)
    assert peer_failure(_in_a_save(TIMED_OUT)) is TIMED_OUT
    assert peer_failure(OSError(28, "No space left on device")) is None
    assert peer_failure(_in_a_save(OSError(28, "No space left on device"))) is None


def test_a_save_cut_short_by_a_silent_peer_is_not_reported_as_the_disk_s(tmp_path):
    saver = object.__new__(Checkpointer)  # only what _not_written reads: the rank and the checkpoints folder
    saver.rank, saver.root = 1, tmp_path
    with pytest.raises(RuntimeError, match="Timed out waiting") as raised:
        saver._not_written(4, _in_a_save(TIMED_OUT))
    assert not isinstance(raised.value, CheckpointNotWritten)
    with pytest.raises(CheckpointNotWritten, match="the checkpoint of step 4 could not be written"):
        saver._not_written(4, _in_a_save(OSError(28, "No space left on device")))
