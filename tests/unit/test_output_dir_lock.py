"""The output_dir lock (``checkpoint/lock.py``): a second holder is told who holds it, and a holder that dies,
however it dies, leaves the directory free."""

from __future__ import annotations

import signal
import subprocess
import sys

from bigtrain.checkpoint.lock import LOCK_FILE, OutputDirLock

HOLD = """
import sys, time
from bigtrain.checkpoint.lock import OutputDirLock
assert OutputDirLock(sys.argv[1]).acquire() is None
print("holding", flush=True)
time.sleep(600)
"""


def test_a_held_output_dir_names_its_holder_and_is_free_once_the_holder_is_killed(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        said = OutputDirLock(tmp_path).acquire()
        assert said is not None and said.startswith(f"pid {holder.pid} on host ")
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel releases the lock
        holder.wait()
    lock = OutputDirLock(tmp_path)
    assert lock.acquire() is None
    assert (tmp_path / LOCK_FILE).is_file()
    lock.release()
