"""Where checkpoints live and which of them are complete.

``output_dir/checkpoints/step_N/`` holds one checkpoint: the DCP files (``.metadata`` and one ``__R_0.distcp`` per
writing rank), ``recipe.yaml``, ``hf/`` (config, generation config, tokenizer: what an HF export needs besides the
weights) and ``bigtrain.json``, the manifest. Ranks write into ``.step_N.partial/``; rank 0 writes the manifest and
renames the folder to ``step_N`` only after every rank's files are on disk, so a folder named ``step_N`` with a
manifest is complete by construction, and a crash at any moment leaves either the old set or the old set plus the
new one. The manifest also records each file's size and XXH3-64 checksum, so a shard that was deleted, truncated or
damaged in place later is named when resuming instead of trained on: each rank checksums the shards it wrote right
after writing them (into ``.checksums/rank_R.json``, merged into the manifest by rank 0), and a start checks every
file before it resumes (``run_dir.plan_start`` falls back to the newest checkpoint that passes). The checksums cost
2.3% of a save's time (bench/results/checkpoint_checksum_cpu.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import xxhash

from bigtrain.errors import ConfigError

CHECKPOINTS = "checkpoints"
MANIFEST = "bigtrain.json"
RECIPE = "recipe.yaml"
HF_FILES = "hf"
DCP_METADATA = ".metadata"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_PARTIAL_SUFFIX = ".partial"


@dataclass(frozen=True)
class Manifest:
    """What rank 0 records when it publishes a checkpoint."""

    step: int  # optimizer steps done
    tokens: int  # tokens trained on so far
    samples: int  # sequences consumed: the data position (the loader is a pure function of the step)
    world_size: int
    plan: dict[str, Any]
    data: dict[str, Any]  # the dataset it was trained on: path, rows, seq_len, shuffle, seed
    files: dict[str, int]  # every file of the checkpoint (relative path) -> size in bytes
    torch_version: str
    # an adapter run's frozen base: {"path", "fingerprint"} (checkpoint/base_model.py); None: the whole model is here
    base: dict[str, str] | None = None
    # every file -> its XXH3-64 (16 hex digits) as written; None: a checkpoint from before checksums (sizes only)
    checksums: dict[str, str] | None = None

    def write(self, folder: Path) -> None:
        (folder / MANIFEST).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise ConfigError(f"{folder} is not a complete bigtrain checkpoint (no {MANIFEST})") from None
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{path} is damaged ({e})") from e


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / CHECKPOINTS


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step}"


def partial_dir(root: Path, step: int) -> Path:
    return root / f".step_{step}{_PARTIAL_SUFFIX}"


def is_complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file() and (folder / DCP_METADATA).is_file()


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """The published checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and is_complete(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def newest_checkpoint(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


def newest_of_run(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint of the run in ``output_dir`` (None: none yet, or no such folder)."""
    return newest_checkpoint(checkpoints_dir(output_dir)) if Path(output_dir).is_dir() else None


def last_good_checkpoint(output_dir: str | os.PathLike | None) -> str:
    """Where a restarted run resumes from: the newest complete checkpoint of ``output_dir``, in words."""
    if output_dir is None:
        return "no checkpoint"
    newest = newest_of_run(output_dir)
    return f"the last good checkpoint is {newest}" if newest is not None else "no checkpoint was written yet"


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder given as itself, as its ``checkpoints/`` folder or as the run's output_dir (the newest
    complete one inside); a clear error when there is none."""
    folder = Path(path)
    if not folder.exists():
        raise ConfigError(f"checkpoint {str(folder)!r} does not exist")
    if is_complete(folder):
        return folder
    for root in (folder, checkpoints_dir(folder)):
        newest = newest_checkpoint(root)
        if newest is not None:
            return newest
    raise ConfigError(
        f"{str(folder)!r} is neither a complete checkpoint (a step_N folder with {MANIFEST}) nor a folder holding one"
    )


def list_files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


CHECKSUMS = ".checksums"  # the per-rank checksum files of a save in progress (not part of the published checkpoint)
_CHUNK = 8 * 2**20


def file_checksum(path: Path) -> str:
    """XXH3-64 of a file, read in chunks into one reused buffer: ~19 GB/s of hashing on the 2-core CI machine
    against zlib's CRC-32 at ~3.7 (bench/checkpoint_checksum.py), so re-reading what was just written is most of
    the cost."""
    digest = xxhash.xxh3_64()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def write_rank_checksums(partial: Path, rank: int) -> None:
    """Checksum the DCP shards this rank wrote (``__R_i.distcp``) into ``.checksums/rank_R.json`` for rank 0."""
    sums = {p.name: file_checksum(p) for p in sorted(partial.glob(f"__{rank}_*.distcp"))}
    folder = partial / CHECKSUMS
    folder.mkdir(exist_ok=True)
    tmp = folder / f".rank_{rank}.json.tmp"
    tmp.write_text(json.dumps(sums))
    tmp.rename(folder / f"rank_{rank}.json")  # whole or absent: rank 0 never reads half a file


def gather_checksums(partial: Path, world_size: int, timeout_s: float = 600.0) -> dict[str, str]:
    """Rank 0: every rank's shard checksums (waiting for ranks still computing theirs, at most ``timeout_s``: the
    run's train.collective_timeout_s, as a collective would), the folder then removed."""
    folder = partial / CHECKSUMS
    deadline = time.monotonic() + timeout_s
    files = [folder / f"rank_{r}.json" for r in range(world_size)]
    while not all(f.is_file() for f in files):
        if time.monotonic() > deadline:
            missing = [f.name for f in files if not f.is_file()]
            # worded as gloo's timeout ("Timed out waiting"): a rank that stopped answering, not a disk problem
            raise RuntimeError(f"Timed out waiting {timeout_s:.0f} s for the shard checksums of {', '.join(missing)}")
        time.sleep(0.02)
    sums: dict[str, str] = {}
    for f in files:
        sums.update(json.loads(f.read_text()))
    shutil.rmtree(folder)
    return sums


def check_files(folder: Path, manifest: Manifest, contents: bool = True) -> None:
    """Every file the manifest lists is present with its recorded size (and with ``contents``, its checksum where
    recorded: a read of the whole checkpoint); raise naming the first one that is not."""
    for name, size in manifest.files.items():
        path = folder / name
        if not path.is_file():
            raise ConfigError(f"checkpoint {folder} is damaged: {path} is missing")
        actual = path.stat().st_size
        if actual != size:
            raise ConfigError(f"checkpoint {folder} is damaged: {path} has {actual} bytes, {size} were written")
    for name, expected in (manifest.checksums or {}).items() if contents else ():
        if file_checksum(folder / name) != expected:
            raise ConfigError(
                f"checkpoint {folder} is damaged: {folder / name} does not match the checksum written at save (its "
                "bytes changed since)"
            )


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A fresh folder beside ``out`` to write it in: published as ``out`` in one rename when the block ends, removed
    when it fails (a failed export, e.g. a full disk, leaves nothing half-written and an older ``out`` as it was)."""
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    out.parent.mkdir(parents=True, exist_ok=True)
    publish(partial, out)


def publish(partial: Path, final: Path) -> None:
    """Make ``partial`` visible as ``final`` in one rename (an older ``final`` is replaced, never half-deleted), its
    files readable as the user's umask says (safetensors writes its files 0600 whatever the umask)."""
    mode = 0o666 & ~_umask()
    for path in partial.rglob("*"):
        if path.is_file():
            path.chmod(mode)
    replaced = final.with_name(final.name + ".replaced")
    if final.exists():
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(final, replaced)
    os.rename(partial, final)
    _fsync_dir(final.parent)
    shutil.rmtree(replaced, ignore_errors=True)


def _umask() -> int:
    current = os.umask(0)  # the only way to read it is to set it: put back at once
    os.umask(current)
    return current


def _fsync_dir(folder: Path) -> None:
    """Persist the rename itself (the directory entry), not only the files' data."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale(root: Path) -> None:
    """Delete what an interrupted save or publish left behind (never a complete checkpoint)."""
    if not root.is_dir():
        return
    for child in root.iterdir():
        if child.name.endswith((_PARTIAL_SUFFIX, ".replaced")):
            shutil.rmtree(child, ignore_errors=True)


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints."""
    for _, folder in complete_checkpoints(root)[:-keep]:
        # rename first: a crash while deleting leaves a stale name that remove_stale clears, not a damaged step_N
        doomed = folder.with_name(folder.name + ".replaced")
        os.rename(folder, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
