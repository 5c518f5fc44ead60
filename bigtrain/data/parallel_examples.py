"""Records tokenised (or image conversations processed) by several processes of this node, in order: what building
a data cache entry spends its time on (a chat template rendered per assistant turn: about a millisecond a
conversation), spread over the CPUs that the other ranks leave idle while they wait for the build.

Workers are forked, so they inherit the tokenizer as loaded (nothing is pickled but the records and their tokens);
chunks of records go out in a bounded window, so memory stays flat whatever the source's size, and come back in
their order, so the rows are those one process would pack. A record's error (its line named) is raised here as the
worker raised it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import islice
from typing import Any

from bigtrain.data.formats import Example, examples
from bigtrain.data.records import Record
from bigtrain.data.tokenizer import Tokenizer

CHUNK = 256  # records per task: large enough that pickling is small beside tokenising
MAX_PROCESSES = 32

_work: Callable[[list[Any]], list[Any]] | None = None  # set in each forked worker by _init


def build_processes() -> int:
    """The CPUs this process may run on (its affinity: what a scheduler gave the job), at most MAX_PROCESSES."""
    return max(1, min(MAX_PROCESSES, len(os.sched_getaffinity(0))))


def tokenised(
    records: Iterable[Record], fmt: str, tokenizer: Tokenizer, text_field: str, key: str, processes: int
) -> Iterator[Example]:
    """Records made examples by ``data.format`` (data/formats.py), by ``processes`` processes, in order."""
    return in_order(records, partial(_examples, fmt, tokenizer, text_field, key), processes)


def in_order(items: Iterable[Any], work: Callable[[list[Any]], list[Any]], processes: int) -> Iterator[Any]:
    """``work`` over chunks of ``items`` by ``processes`` forked workers (it is inherited, not pickled; its results
    are), the results in the items' order; one process: here, a chunk at a time."""
    stream = iter(items)
    chunks = iter(lambda: list(islice(stream, CHUNK)), [])
    if processes <= 1:
        for chunk in chunks:
            yield from work(chunk)
        return
    pool = multiprocessing.get_context("fork").Pool(processes, initializer=_init, initargs=(work,))
    try:
        pending: deque[Any] = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_run, (chunk,)))
            if len(pending) >= 2 * processes:  # a bounded window of chunks in flight
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()
    finally:
        pool.terminate()
        pool.join()


def _examples(fmt: str, tokenizer: Tokenizer, text_field: str, key: str, chunk: list[Record]) -> list[Example]:
    return list(examples(chunk, fmt, tokenizer, text_field, key))


def _init(work: Callable[[list[Any]], list[Any]]) -> None:
    """A worker's start: its work; Ctrl-C is its builder's to handle (which stops the pool), and a builder killed
    outright takes its workers with it (no orphan tokenising on)."""
    global _work
    _work = work
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):  # prctl(PR_SET_PDEATHSIG, SIGKILL): the builder's death ends this worker
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _run(chunk: list[Any]) -> list[Any]:
    assert _work is not None
    return _work(chunk)
