"""Records (one dict per document, conversation or prompt/completion pair) from where a fine-tuner keeps data.

- a ``.jsonl`` file: read here, line by line, so an error names its line;
- a ``.txt`` file: one record, the whole text;
- a local HF dataset: a ``save_to_disk`` folder (``datasets.load_from_disk``), or ``.parquet``/``.arrow``/``.json``/
  ``.jsonl`` files given as a file, a folder of them or a glob (``datasets.load_dataset`` with its packaged builder
  for that format). Nothing is downloaded: every path is local.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from bigtrain.errors import ConfigError

BUILTIN_PREFIX = "builtin:"
DATASET_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json"}
SAVED_DATASET_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")


def is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def describe_sources() -> str:
    return (
        "a .npy, .bin (token ids; Megatron's with its .idx), .jsonl, .txt, .parquet, .arrow or .json file, a folder "
        "of them, a save_to_disk folder or a glob"
    )


def check_records_path(key: str, path: str) -> None:
    """Fail early for a path no reader takes (every rank, before any process group)."""
    if is_glob(path):
        if not glob.glob(path):
            raise ConfigError(f"{key}={path!r} matches no file; give {describe_sources()}")
        _data_files(key, path)
        return
    p = Path(path)
    if p.is_dir():
        if not _is_saved_dataset(p):
            _data_files(key, path)
        return
    if not p.is_file():
        raise ConfigError(f"{key}={path!r} does not exist; give {describe_sources()}, or builtin:stories")
    if p.suffix not in (".npy", ".txt", *DATASET_SUFFIXES):
        raise ConfigError(f"{key}={path!r} has suffix {p.suffix!r}; give {describe_sources()}")


Record = tuple[str, dict[str, Any]]  # where it is (for errors: "line 7", "record 7") and its fields


def is_chat(value: Any) -> bool:
    """A list of chat messages (each a dict with a role), as prompts and answers may be given."""
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value)


def records_or_builtin(key: str, path: str, split: str, builtin: str, refusal: str) -> Iterable[Record]:
    """The records at ``path`` (their text field ``prompt``), or 2000 of built-in corpus ``builtin`` for
    ``builtin:NAME``; another built-in corpus is refused with ``refusal``, which ends with what to give instead."""
    if path.startswith(BUILTIN_PREFIX):
        name = path.removeprefix(BUILTIN_PREFIX)
        if name != builtin:
            raise ConfigError(f"{key}={path!r}: {refusal}")
        from bigtrain.data.builtin import builtin_records

        return ((f"record {i}", r) for i, r in enumerate(builtin_records(name, 2000)))
    check_records_path(key, path)
    return read_records(key, path, "prompt", split)


def read_records(key: str, path: str, text_field: str, split: str) -> Iterator[Record]:
    """The records at ``path`` in order."""
    p = Path(path)
    if not is_glob(path) and p.is_file() and p.suffix == ".txt":
        yield "the file", {text_field: _read_utf8(key, p)}
    elif not is_glob(path) and p.is_file() and p.suffix == ".jsonl":
        yield from _read_jsonl(key, p)
    else:
        yield from _hf_dataset(key, path, split)


def _is_saved_dataset(folder: Path) -> bool:
    return any((folder / name).is_file() for name in SAVED_DATASET_FILES)


def _data_files(key: str, path: str) -> tuple[str, list[str]]:
    """The builder and files of a file, folder or glob of one data-file format."""
    if is_glob(path):
        files = sorted(glob.glob(path))
    elif Path(path).is_dir():
        files = sorted(str(f) for f in Path(path).iterdir() if f.suffix in DATASET_SUFFIXES)
        if not files:
            raise ConfigError(
                f"{key}={path!r} is a folder with neither a saved dataset (dataset_info.json) nor data files; "
                f"give {describe_sources()}"
            )
    else:
        files = [path]
    builders = {DATASET_SUFFIXES.get(Path(f).suffix) for f in files}
    if None in builders or len(builders) != 1:
        kinds = sorted({Path(f).suffix or "(none)" for f in files})
        raise ConfigError(
            f"{key}={path!r} holds files of kinds {', '.join(kinds)}; a folder or glob must hold one kind of "
            f"{', '.join(DATASET_SUFFIXES)}"
        )
    return builders.pop(), files  # type: ignore[return-value]


def _hf_dataset(key: str, path: str, split: str) -> Iterator[Record]:
    for i, record in enumerate(open_dataset(key, path, split)):
        yield f"record {i}", record


def is_dataset_path(path: str) -> bool:
    """Whether ``path`` names a local HF dataset: a save_to_disk folder, or data files (a glob or a file)."""
    p = Path(path)
    return is_glob(path) or (p.is_dir() and _is_saved_dataset(p)) or (p.is_file() and p.suffix in DATASET_SUFFIXES)


def open_dataset(key: str, path: str, split: str) -> Any:
    """A local HF dataset as a ``datasets.Dataset`` (memory-mapped Arrow, read by index): a ``save_to_disk`` folder
    (its ``split`` where it holds several), or data files as one split."""
    import datasets

    try:  # (every rank reads the files itself; datasets' file locks serialise building its cache)
        if not is_glob(path) and Path(path).is_dir() and _is_saved_dataset(Path(path)):
            data = datasets.load_from_disk(path)
        else:
            if split != "train":
                raise ConfigError(
                    f"data.split={split!r} applies to a saved DatasetDict folder; {key}={path!r} is data files, "
                    "which are one split: point at the split's files instead"
                )
            builder, files = _data_files(key, path)
            data = datasets.load_dataset(builder, data_files=files, split="train")
    except (OSError, ValueError, datasets.exceptions.DatasetGenerationError) as e:  # type: ignore[attr-defined]
        raise ConfigError(f"{key}={path!r} could not be read as a HF dataset ({str(e).splitlines()[0]})") from e
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise ConfigError(
                f"{key}={path!r} has splits {', '.join(data)} but not data.split={split!r}; set data.split to one"
            )
        data = data[split]
    return data


def _read_utf8(key: str, path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{key}={str(path)!r} is not UTF-8 text (byte {e.start}, line {line}); convert it, e.g. "
            "iconv -f latin1 -t utf-8"
        ) from e


def _read_jsonl(key: str, path: Path) -> Iterator[Record]:
    # the file's own lines (newline-separated), not str.splitlines: JSON strings may hold U+2028 and friends raw
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{key}={str(path)!r} line {lineno} is not JSON ({e.msg})") from e
                if not isinstance(obj, dict):
                    raise ConfigError(f"{key}={str(path)!r} line {lineno} is not a JSON object")
                yield f"line {lineno}", obj
    except UnicodeDecodeError:
        _read_utf8(key, path)  # raises with the byte and line of the first bad character
        raise


def open_stream(key: str, path: str, split: str) -> Any:
    """``path`` as a HF ``IterableDataset`` (``data.streaming``): local data files, a folder or glob of them, a
    ``save_to_disk`` folder, or else what ``datasets.load_dataset`` streams by name or URL. Its ``state_dict`` is the
    position after the last record it gave."""
    import datasets

    p = Path(path)
    local = is_glob(path) or p.exists()
    try:
        if local and not is_glob(path) and p.is_dir() and _is_saved_dataset(p):
            data = datasets.load_from_disk(path)
            if isinstance(data, datasets.DatasetDict):
                if split not in data:
                    raise ConfigError(f"{key}={path!r} has splits {', '.join(data)} but not data.split={split!r}")
                data = data[split]
            return data.to_iterable_dataset()
        if local:
            if not is_glob(path) and p.is_file() and p.suffix not in DATASET_SUFFIXES:
                raise ConfigError(
                    f"{key}={path!r} cannot be streamed (data.streaming); give .parquet, .arrow, .json or .jsonl "
                    "files, a folder or glob of them, a save_to_disk folder or a dataset name"
                )
            builder, files = _data_files(key, path)
            return datasets.load_dataset(builder, data_files=files, split="train", streaming=True)
        return datasets.load_dataset(path, split=split, streaming=True)
    except (OSError, ValueError, datasets.exceptions.DatasetGenerationError) as e:  # type: ignore[attr-defined]
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{key}={path!r} could not be opened as a streamed HF dataset ({first})") from e
