"""The exception types for what a user can fix (bad input, a run that diverged, a checkpoint the disk could not take),
and for a start that has nothing to do (the run is finished).

Anything the user can fix (a recipe key, a flag, a missing file) raises :class:`ConfigError` with one sentence that
names the key and what would work. The CLI turns it into a single ``bigtrain: error: ...`` line and exit code 2, on
every rank, before any collective is entered, so a bad recipe can never leave one rank waiting for another.
A collective that fails for want of another rank is recognised here too (``peer_failure``), wherever it surfaces.
"""

from __future__ import annotations

# what gloo (and NCCL) raise on a rank whose peer died mid-collective
PEER_GONE = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "Socket Timeout",
    "Connection refused",  # at start: a peer of the last attempt, gone
)
# what they raise when a peer is alive but does not answer within the group's timeout (gloo's recv/send wait, NCCL's
# watchdog)
NO_ANSWER = ("Timed out waiting", "Watchdog caught collective operation timeout")


class ConfigError(ValueError):
    """A user-fixable problem, phrased as one line naming the key and a value that would work."""


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN or infinite; raised on every rank at the same step."""


class CheckpointNotWritten(RuntimeError):
    """A checkpoint could not be written (a full disk); the partial folder is gone, the last good one is named."""


class RunFinished(Exception):
    """The recipe's run already reached train.steps: nothing is wrong, nothing is done (exit code 0)."""


def peer_failure(e: BaseException) -> BaseException | None:
    """The error in ``e`` that shows a collective failed because another rank died, vanished or did not answer (``e``
    itself, or one rank's error inside DCP's ``CheckpointException``), or None: the problem is this rank's own."""
    import torch.distributed as dist

    if isinstance(e, (dist.DistBackendError, dist.DistNetworkError)):
        return e
    if isinstance(e, RuntimeError) and any(text in str(e) for text in (*PEER_GONE, *NO_ANSWER)):
        return e
    for failure in (getattr(e, "failures", None) or {}).values():  # DCP: rank -> (exception, traceback)
        found = peer_failure(failure[0] if isinstance(failure, tuple) else failure)
        if found is not None:
            return found
    return None


def no_answer(e: BaseException) -> bool:
    """Whether a peer failure is a timeout: the other rank is alive (hung or stopped), not gone."""
    return any(text in str(e) for text in NO_ANSWER)
