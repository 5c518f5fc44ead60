"""An image folder's index (one sub-folder of images per class) in the data cache: its classes, every image's path
and label, with each file's header checked once, when the entry is built; every later start maps the index instead
of listing and opening every image again.

The entry is keyed by the folder's directories (each one's path and modification time, found by walking the
directories only, without a stat per file): adding, removing or renaming an image changes its directory's time,
so the index is built again. An image rewritten in place under the same name keeps the index, which holds no pixel
(images are decoded per step). Paths are kept as one UTF-8 blob with offsets, mapped, so a rank's memory does not
grow with the number of images.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bigtrain.data import cache

PATHS, OFFSETS, LABELS = "paths.bin", "offsets.bin", "labels.bin"


@dataclass(frozen=True)
class FolderIndex:
    folder: Path
    classes: list[str]
    labels: np.ndarray  # [images] int64, mapped
    blob: np.ndarray  # uint8, mapped: every relative path, UTF-8, one after another
    offsets: np.ndarray  # [images + 1] int64, mapped
    note: str

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> Path:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.folder / bytes(self.blob[start:end]).decode("utf-8")


def directories_identity(folder: Path) -> str:
    """A digest of every directory under ``folder`` (its path and modification time), walked in sorted order."""
    digest = hashlib.sha256()
    for root, dirs, _files in os.walk(folder):
        dirs.sort()
        st = os.stat(root)
        digest.update(f"{os.path.relpath(root, folder)}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def folder_index(
    cache_dir: Path, key: str, folder: Path, build: Callable[[], tuple[list[str], list[Path], np.ndarray]]
) -> FolderIndex:
    """The index of ``folder`` from the cache, built by ``build() -> (classes, paths, labels)`` (which lists and
    checks the images) when no entry matches."""
    parts = {"kind": "image folder", "folder": str(folder.resolve()), "directories": directories_identity(folder)}

    def write(out: Path) -> dict[str, Any]:
        classes, paths, labels = build()
        encoded = [str(p.relative_to(folder)).encode("utf-8") for p in paths]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        (out / PATHS).write_bytes(b"".join(encoded))
        offsets.tofile(out / OFFSETS)
        np.asarray(labels, dtype=np.int64).tofile(out / LABELS)
        return {"classes": classes, "images": len(encoded)}

    found = cache.entry(cache_dir, "images", key, parts, write)
    n = found.meta["images"]
    blob_size = (found.folder / PATHS).stat().st_size
    blob = np.memmap(found.folder / PATHS, dtype=np.uint8, mode="r") if blob_size else np.zeros(0, np.uint8)
    return FolderIndex(
        folder,
        list(found.meta["classes"]),
        np.memmap(found.folder / LABELS, dtype=np.int64, mode="r", shape=(n,)),
        blob,
        np.memmap(found.folder / OFFSETS, dtype=np.int64, mode="r", shape=(n + 1,)),
        found.note(key),
    )
