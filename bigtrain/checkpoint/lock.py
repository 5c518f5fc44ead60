"""One run at a time in an ``output_dir``: the run that starts first holds a lock there for its whole life.

The lock is a POSIX record lock (``fcntl.lockf``) on ``output_dir/.bigtrain.lock``, taken by rank 0 once the process
group exists and before anything in ``output_dir`` is touched. POSIX locks are what NFS and the other shared
filesystems of clusters implement (``flock`` is not, on all of them), and the kernel (or the NFS server, when the
client's lease ends) releases them when the holding process dies, however it dies: a crashed run never leaves
``output_dir`` locked. While it holds the lock, the run writes who it is into the file (host, pid, start time,
launcher run id), so a second start can say whom it found there.

Two limits, both of POSIX locks: a process does not conflict with itself (two jobs inside one Python process are not
told apart), and a filesystem without lock support is reported as a warning and the run goes on unlocked.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

log = logging.getLogger("bigtrain")

LOCK_FILE = ".bigtrain.lock"


class OutputDirLock:
    """``acquire()`` once; the lock lasts until ``release()`` or the end of the process."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> str | None:
        """Take the lock; None when it is ours, else a description of the run that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                holder = _describe(os.pread(fd, 4096, 0))
                os.close(fd)
                return holder
            os.close(fd)
            log.warning("output_dir lock not taken (%s does not support locks: %s); run on unlocked", self.path, e)
            return None
        if not _still_named(fd, self.path):  # a run that ended removed it while this start waited to lock it
            os.close(fd)
            return self.acquire()
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return None

    def release(self, remove: bool = False) -> None:
        """Give the lock up; ``remove``: at a clean end, the file goes too (unlinked while still held: a start that
        opened it meanwhile finds, once it holds it, that the path no longer names it, and takes a new one)."""
        if self._fd is not None:
            if remove:
                self.path.unlink(missing_ok=True)
            os.close(self._fd)  # closing any descriptor of the file releases a POSIX lock
            self._fd = None


def _still_named(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _holder() -> dict[str, object]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "run_id": os.environ.get("TORCHELASTIC_RUN_ID", ""),
    }


def _describe(raw: bytes) -> str:
    try:
        info = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return "another run (starting up)"
    run = f", launcher run {info['run_id']}" if info.get("run_id") else ""
    return f"pid {info.get('pid')} on host {info.get('host')}, started {info.get('started')}{run}"
