"""The data cache: a source's tokenised form is built once into files keyed by a fingerprint of everything that
changes it, and every later reader (another rank, a restart, the next run) maps those files instead of reading and
tokenising the records again.

An entry is a folder ``<cache_dir>/<kind>-<fingerprint>`` holding its files and ``meta.json`` (written last). It is
built aside, in a ``.partial`` folder of the same cache, and renamed into place whole, so a build killed half-way
leaves nothing that is read. One process builds an entry while the others wanting it wait on a file lock (ranks of
a job, or two jobs sharing the cache); a waiter whose builder failed on bad input raises the builder's own error
instead of tokenising the same records to the same line again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigtrain.errors import ConfigError

log = logging.getLogger(__name__)  # said by rank 0 (the CLI's logging), once

# bump when what a build writes changes (files, dtypes, packing rules): older entries are then never read
DATA_FORMAT_VERSION = 1
META = "meta.json"
# files of a tokenizer folder whose bytes decide the ids and the chat template (not the model's weights beside them)
TOKENIZER_PATTERNS = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab*",
    "merges.txt",
    "*.model",
    "chat_template*",
)


def default_cache_dir() -> Path:
    """HF datasets' cache, as ``datasets`` finds it (``HF_DATASETS_CACHE``, else ``HF_HOME/datasets``, else
    ``$XDG_CACHE_HOME/huggingface/datasets``), in a ``bigtrain`` folder: the place peers already keep tokenised data,
    and found without importing ``datasets``."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser() / "bigtrain"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
    return Path(home).expanduser() / "datasets" / "bigtrain"


def cache_dir_of(data_cfg: Any) -> Path:
    """``data.cache_dir``, or the default (HF datasets' cache)."""
    return Path(data_cfg.cache_dir).expanduser() if data_cfg.cache_dir else default_cache_dir()


def files_identity(paths: list[Path]) -> list[list[Any]]:
    """Each file by its resolved path, size and modification time (what changes when a file is written again),
    without reading it: a source of a million records is fingerprinted at once."""
    out = []
    for p in sorted(paths):
        st = p.stat()
        out.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
    return out


def source_identity(path: str) -> list[Any]:
    """What a data path's entry is keyed by: its files' identity, or for a built-in corpus (``builtin:NAME``,
    generated) the generator's own file."""
    if path.startswith("builtin:"):
        from bigtrain.data import builtin

        return ["builtin", path, files_identity([Path(builtin.__file__)])]
    return files_identity(source_files(path))


def source_files(path: str) -> list[Path]:
    """The files a data path reads: the file, a folder's files (recursively: a saved dataset), or a glob's."""
    import glob

    if any(c in path for c in "*?["):
        return [Path(p) for p in glob.glob(path) if Path(p).is_file()]
    p = Path(path)
    if p.is_dir():
        return [f for f in p.rglob("*") if f.is_file()]
    return [p]


def tokenizer_identity(folder: str | None) -> str | None:
    """A digest of the tokenizer files' bytes (ids, merges, special tokens, the chat template); None: the built-in
    byte tokenizer."""
    if folder is None:
        return None
    digest = hashlib.sha256()
    names = sorted({f for pattern in TOKENIZER_PATTERNS for f in Path(folder).glob(pattern) if f.is_file()})
    for f in names:
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def fingerprint(parts: dict[str, Any]) -> str:
    """What an entry was built from, as a short digest (the same parts: the same entry)."""
    text = json.dumps({"format_version": DATA_FORMAT_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Entry:
    folder: Path
    meta: dict[str, Any]
    built: bool  # built by this process now (False: it was there, or another process built it while we waited)
    seconds: float  # spent building or waiting

    def said(self) -> str:
        """How this start came by it, for the start-up's line."""
        if self.built:
            return f"built in {self.seconds:.1f} s"
        return f"built by another process, waited {self.seconds:.1f} s" if self.seconds else "read"

    def note(self, key: str) -> str:
        """The start-up's line for the source ``key`` (e.g. ``data.path``): where the entry is and how it came."""
        return f"{key}: data cache {self.folder} ({self.said()})"


def entry(
    cache_dir: Path, kind: str, key: str, parts: dict[str, Any], build: Callable[[Path], dict[str, Any]]
) -> Entry:
    """The cache entry of ``parts``, built by ``build(folder) -> meta`` into an empty folder when no process has
    built it yet; ``key`` (e.g. ``data.path``) names the source in what is printed."""
    start = time.perf_counter()
    name = f"{kind}-{fingerprint(parts)}"
    final = cache_dir / name
    meta = _read_meta(final)
    if meta is not None:
        return Entry(final, meta, False, 0.0)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"data.cache_dir={str(cache_dir)!r} cannot be created ({e.strerror}); set data.cache_dir to a writable "
            "folder"
        ) from e
    waited_since = time.time()
    with _locked(cache_dir / f".{name}.lock", key):
        meta = _read_meta(final)  # built by the process we waited for
        if meta is not None:
            return Entry(final, meta, False, time.perf_counter() - start)
        _raise_builders_error(cache_dir / f".{name}.error", waited_since)
        for stale in cache_dir.glob(f".{name}.*.partial"):  # a build killed half-way: never read, removed now
            shutil.rmtree(stale, ignore_errors=True)
        partial = cache_dir / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial"
        partial.mkdir()
        try:
            meta = build(partial)
            (partial / META).write_text(json.dumps({"parts": parts, **meta}, default=str))
            os.replace(partial, final)
        except ConfigError as e:
            (cache_dir / f".{name}.error").write_text(str(e))
            raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return Entry(final, meta, True, time.perf_counter() - start)


def counted(items: Iterable[Any], key: str, doing: str, unit: str = "records") -> Iterator[Any]:
    """``items`` as a build reads them, with a progress bar (``unit``/s) on this process's terminal once the build
    takes more than two seconds: a long build is never silent, a short one prints nothing."""
    from tqdm import tqdm

    bar = tqdm(desc=f"{key}: {doing}", unit=f" {unit}", file=sys.stderr, mininterval=0.5, delay=2.0, leave=False)
    try:
        for item in items:
            bar.update(1)
            yield item
    finally:
        bar.close()


def _read_meta(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / META).read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def _locked(path: Path, key: str) -> Iterator[None]:
    """Hold ``path``'s exclusive lock (released by the kernel if this process dies, so a killed builder never
    leaves the others waiting); say once when another process holds it."""
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("%s: waiting for another process building its data cache", key)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _raise_builders_error(path: Path, waited_since: float) -> None:
    """The error of a build that failed on bad input while we waited for it (an older error file is a past run's:
    the data may have been fixed since, so it is built again)."""
    try:
        if path.stat().st_mtime >= waited_since - 1.0:
            raise ConfigError(path.read_text())
    except FileNotFoundError:
        pass
