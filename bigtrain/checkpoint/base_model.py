"""The frozen base of an adapter run: named by its path and pinned by a fingerprint, since checkpoints omit it.

A LoRA/QLoRA checkpoint holds the adapters only; resuming or merging reads the base again from
``model.name_or_path``. If those files changed (another model, re-downloaded with other values), the adapters would
silently land on a base they were not trained with, so the checkpoint records a fingerprint of the base and every
later use compares it first. The fingerprint reads each file's size, the safetensors header (names, shapes, dtypes,
offsets) and 16 evenly spaced 64 KiB samples of the values: milliseconds for a 140 GB model, and any re-save with
other values changes it. (Not a full hash: an edit that touches none of the sampled bytes would go unseen.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from bigtrain.errors import ConfigError

SAMPLES, SAMPLE_BYTES = 16, 64 * 1024


def _file_digest(path: Path, digest: Any) -> None:
    size = path.stat().st_size
    digest.update(f"{path.name}:{size}".encode())
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little") if path.suffix == ".safetensors" else 0
        f.seek(0)
        digest.update(f.read(8 + header_len if header_len else min(size, SAMPLE_BYTES)))
        for i in range(SAMPLES):
            f.seek(size * i // SAMPLES)
            digest.update(f.read(SAMPLE_BYTES))


def fingerprint(folder: str | Path) -> str:
    """A digest of the model folder's config and weight files (see the module docstring)."""
    folder = Path(folder)
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")) + [folder / "config.json"]:
        if path.is_file():
            _file_digest(path, digest)
    return digest.hexdigest()[:32]


def base_record(name_or_path: str | None) -> dict[str, str] | None:
    """What a checkpoint of an adapter run records about its base (None: a model built from its config, whose
    values come from train.seed and are rebuilt exactly)."""
    if name_or_path is None:
        return None
    # absolute: the adapter folder exported from it names its base so that it loads from any directory
    return {"path": str(Path(name_or_path).resolve()), "fingerprint": fingerprint(name_or_path)}


def check_base(name_or_path: str | Path | None, recorded: dict[str, str] | None, what: str) -> None:
    """Refuse (one line) to ``what`` (resume, merge) on a base other than the one the adapters were trained on."""
    if recorded is None or name_or_path is None:
        return
    folder = Path(name_or_path)
    if not folder.is_dir():
        raise ConfigError(
            f"{what}: the base model {folder} is not there; the adapters were trained on {recorded['path']}: point "
            "model.name_or_path at it"
        )
    if fingerprint(folder) != recorded["fingerprint"]:
        raise ConfigError(
            f"{what}: the base model {folder} is not the one the adapters were trained on ({recorded['path']}, "
            f"fingerprint {recorded['fingerprint']}): its files changed; point model.name_or_path at the original "
            "base, or start a new run (checkpoint.resume=false)"
        )
