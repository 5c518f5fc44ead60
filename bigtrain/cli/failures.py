"""How a worker says why it stopped: one line, once.

A worker that fails with one of bigtrain's errors (bad input, divergence, a checkpoint not written), is interrupted,
or loses contact with another rank (the peer died: gloo's "Connection reset by peer") says it in one line. Under
``bigtrain train --nproc`` (workers started with ``--quiet-failures``) it writes the line to the error file torch's
elastic launcher gives every worker (``TORCHELASTIC_ERROR_FILE``, the launcher's own contract) instead, and the
launcher prints the root cause once (``cli/launch.py``). Under torchrun or ``accelerate launch`` each worker prints
its line itself, as it always did.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn

from bigtrain.checkpoint.layout import last_good_checkpoint
from bigtrain.errors import no_answer, peer_failure
from bigtrain.runtime import LaunchEnv

EXIT_LOST_RANK = 6  # another rank died or vanished (its collective failed on this one)
EXIT_NO_ANSWER = 7  # a collective waited train.collective_timeout_s for another rank (hung or stopped)
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130: Ctrl-C, as shells report it
# what a run stopped by a signal after its checkpoint exits with: SIGTERM's is a clean end (documented: schedulers
# re-queue a non-zero exit), Ctrl-C's the shell's 130
EXIT_AFTER = {signal.SIGTERM: 0, signal.SIGINT: EXIT_INTERRUPTED}


def peer_lost(e: BaseException) -> bool:
    """Whether ``e`` is a collective failing because another rank died, vanished or did not answer."""
    return peer_failure(e) is not None


def rank_tag(env: LaunchEnv) -> str:
    """How a worker's line names its rank (nothing for a process started without a launcher)."""
    return f" (rank {env.rank}/{env.world_size})" if env.launched else ""


def stop_for_lost_peer(
    e: BaseException, env: LaunchEnv, quiet: bool, output_dir: str | None, timeout_s: int | None
) -> NoReturn:
    """Say that a collective failed for want of another rank (it died, or did not answer within the group's timeout)
    with the last good checkpoint, and leave at once: the failed collective's work is still held by gloo's threads,
    and interpreter shutdown would free it after Python is gone ("terminate called without an active exception")."""
    e = peer_failure(e) or e
    cause = str(e).strip().splitlines()[0][:200]
    if no_answer(e):
        waited = f"train.collective_timeout_s={timeout_s}" if timeout_s else "the collective timeout"
        what, code = f"no answer from another rank within {waited} ({cause}): it hung or was stopped", EXIT_NO_ANSWER
    else:
        what, code = f"lost contact with another rank ({cause}): it stopped or died", EXIT_LOST_RANK
    say(f"error{rank_tag(env)}: {what}; {last_good_checkpoint(output_dir)}; start again to resume", env, quiet, code)
    sys.stdout.flush()
    os._exit(code)


def say(message: str, env: LaunchEnv, quiet: bool, code: int) -> None:
    """The worker's one line and the exit code it ends with: into the launcher's error file, and on stderr unless
    the launcher prints it (the agent may stop this worker before it exits with ``code`` itself)."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not (quiet and error_file):  # first: the launcher may stop this rank as soon as another one has failed
        # one write(2) call: ranks share the launcher's stderr, and a single short write is never interleaved; it
        # starts a line of its own, since rank 0's progress bar may be mid-line on the same stderr
        sys.stderr.flush()
        fresh_line = "\n" if env.world_size > 1 else ""
        os.write(2, f"{fresh_line}bigtrain: {message}\n".encode())
    if quiet and error_file:  # only for bigtrain's launcher: torchrun would print it again in its failure table
        info = {"timestamp": str(int(time.time())), "exitcode": str(code)}
        data = {"message": {"message": message, "extraInfo": info}}
        Path(error_file).write_text(json.dumps(data))
