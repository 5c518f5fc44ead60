"""The exception types for what a user can fix (bad input, a run that diverged, a checkpoint the disk could not take),
and for a start that has nothing to do (the run is finished).

Anything the user can fix (a recipe key, a flag, a missing file) raises :class:`ConfigError` with one sentence that
names the key and what would work. The CLI turns it into a single ``bigtrain: error: ...`` line and exit code 2, on
every rank, before any collective is entered, so a bad recipe can never leave one rank waiting for another.
"""


class ConfigError(ValueError):
    """A user-fixable problem, phrased as one line naming the key and a value that would work."""


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN or infinite; raised on every rank at the same step."""


class CheckpointNotWritten(RuntimeError):
    """A checkpoint could not be written (a full disk); the partial folder is gone, the last good one is named."""


class RunFinished(Exception):
    """The recipe's run already reached train.steps: nothing is wrong, nothing is done (exit code 0)."""
