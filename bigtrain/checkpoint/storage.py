"""What went wrong when a checkpoint or the final model could not be written, in words a user acts on.

A full disk surfaces in many shapes: an ``OSError`` with ``ENOSPC`` from a file write, torch's zip writer's
``RuntimeError: [enforce fail at inline_container.cc]``, or DCP's ``CheckpointException`` carrying each rank's
error. The error's chain (causes, contexts, DCP's per-rank failures) is searched for ENOSPC, and the free space of
the folder is looked at too: nearly nothing left says the same.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

NEARLY_FULL_BYTES = 64 * 2**20  # less than this free after a failed write: the disk is what failed


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error, its causes and contexts, and the per-rank errors DCP gathered (``failures``)."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        for failure in getattr(e, "failures", {}).values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, BaseException):
                todo.append(inner)


def is_disk_full(error: BaseException, folder: Path) -> bool:
    for e in _chain(error):
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e):
            return True
    try:
        return shutil.disk_usage(_existing(folder)).free < NEARLY_FULL_BYTES
    except OSError:
        return False


def storage_problem(error: BaseException, folder: Path) -> str:
    """``no space left on device`` for a full disk, else the error's first line."""
    if is_disk_full(error, folder):
        return "no space left on device"
    text = (str(error).strip().splitlines() or [""])[0][:300]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder
