"""The output_dir lock (``checkpoint/lock.py``): a second holder is told who holds it, and a holder that dies,
however it dies, leaves the directory free."""

from __future__ import annotations

import os
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


def test_a_clean_end_removes_the_lock_file_and_the_next_start_takes_a_new_one(tmp_path):
    first = OutputDirLock(tmp_path)
    assert first.acquire() is None
    waiting = os.open(first.path, os.O_RDWR)  # a start that opened the file before the end, as the race has it
    first.release(remove=True)
    assert not first.path.exists()
    second = OutputDirLock(tmp_path)
    assert second.acquire() is None and second.path.exists()
    assert os.fstat(waiting).st_ino != os.stat(second.path).st_ino  # the old inode is nobody's lock any more
    os.close(waiting)
    second.release()
    assert second.path.exists()  # a lock given up without remove (a failed run) stays, as before
