"""Image conversations through the data cache (data/cache.py): each conversation rendered, its images opened,
checked and expanded by the processor once, into files every rank, restart and later run maps.

An entry holds the expanded rows and their targets (``rows.bin``, ``targets.bin``: data/row_files.py), each
conversation's rendered text and image paths (``texts.bin``/``images.bin``, UTF-8 one after another, with their
offsets), and its images' pixels in the processor's budget (``pixels.npy``). It is keyed by the data files, the
processor's files (tokenizer, chat template, image processor), the image processor's settings, the transformers
version (which renders and expands) and the keys that change the rows; an image rewritten in place under the same
name is not seen (the images are not read to fingerprint them: a micro-batch whose image then expands into other
tokens stops the run, naming the entry to remove).

Only conversations whose images are files are cached, as the first conversation shows; a dataset holding the images
themselves (a HF image column) is processed in memory at each start (data/image_chat.py), as is one whose later
conversation holds an image (the build stops there).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from bigtrain.config.schema import DataConfig
from bigtrain.data import cache
from bigtrain.data.image_chat import (
    BUILTIN_PREFIX,
    ImageChats,
    conversation_of,
    described,
    in_memory,
    processed,
    records_of,
    too_long_error,
)
from bigtrain.data.parallel_examples import build_processes, in_order
from bigtrain.data.row_files import RowWriter, open_rows
from bigtrain.errors import ConfigError

ROW_KEYS = ("seq_len", "image_field", "text_field", "split", "min_pixels", "max_pixels")
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")


class NotFiles(Exception):
    """A conversation's image is not a file (a dataset holding images): the conversations cannot be cached."""


def load_image_chats(data_cfg: DataConfig, key: str, path: str, processor: Any, seed: int) -> ImageChats:
    """The conversations at ``path`` (or the built-in set), processed and checked, through the data cache when
    their images are files (below), else held in memory (data/image_chat.in_memory)."""
    if data_cfg.seq_len is None:
        raise ConfigError(f"{key}: image-text-to-text rows need data.seq_len (tokens per row, image tokens included)")
    if not path.startswith(BUILTIN_PREFIX):
        cached = cached_image_chats(data_cfg, key, path, processor)
        if cached is not None:
            return cached
    records, root = records_of(data_cfg, key, path, seed)
    return in_memory(data_cfg, key, path, processor, records, root)


def cached_image_chats(data_cfg: DataConfig, key: str, path: str, processor: Any) -> ImageChats | None:
    """The conversations at ``path`` from the data cache (built now if no process has), or None when their images
    are not files."""
    import transformers

    records, root = records_of(data_cfg, key, path, seed=0)  # checks the path first
    first = next(iter(records), None)
    if first is None or not _all_files(key, path, first, data_cfg.image_field):
        return None  # the first conversation's images are not files: the dataset holds its images
    folder = getattr(processor.tokenizer, "name_or_path", None)
    parts = {
        "kind": "image chats",
        "source": cache.source_identity(path),
        "processor": processor_identity(folder),
        # what renders and expands a conversation besides the folder's files
        "image_processor": processor.image_processor.to_json_string(),
        "transformers": transformers.__version__,
        **{name: getattr(data_cfg, name) for name in ROW_KEYS},
    }
    try:
        found = cache.entry(
            cache.cache_dir_of(data_cfg), "chats", key, parts, lambda out: _build(data_cfg, key, path, processor, out)
        )
    except NotFiles:
        return None
    meta, entry = found.meta, found.folder
    arrays = open_rows(entry, meta["num_rows"], meta["seq_len"], meta["dtypes"])
    return ImageChats(
        processor=processor,
        texts=Strings(entry / "texts"),
        images=Strings(entry / "images", json.loads),
        ids=arrays["rows"],  # type: ignore[arg-type]
        targets=arrays["targets"],  # type: ignore[arg-type]
        vocab_size=meta["vocab_size"],
        description=described(path, meta["num_rows"], meta["images"], meta["image_tokens"]),
        image_tokens=meta["image_tokens"],
        image_count=meta["images"],
        resized=meta["resized"],
        row_pixels=np.load(entry / "pixels.npy"),
        examples=meta["num_rows"],
        cache_note=found.note(key),
    )


def processor_identity(folder: str | None) -> str | None:
    """A digest of the processor folder's files but its weights (tokenizer, chat template, image processor)."""
    if folder is None or not Path(folder).is_dir():
        return None
    digest = hashlib.sha256()
    for f in sorted(Path(folder).iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHTS) and not f.name.startswith("."):
            digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def _all_files(key: str, path: str, first: Any, image_field: str) -> bool:
    """Whether the first record's images are named files (a jsonl's paths), not images held in the dataset."""
    _, pictures = conversation_of(key, path, first[0], first[1], image_field)
    return all(isinstance(p, str) or (isinstance(p, dict) and isinstance(p.get("path"), str)) for p in pictures)


class Strings:
    """Texts written one after another (``NAME.bin``, UTF-8) with their offsets (``NAME.idx``), read one at a time
    from the mapped file; ``parse`` makes each into what it holds (an image list from its JSON)."""

    def __init__(self, stem: Path, parse: Any = None) -> None:
        self.offsets = np.load(f"{stem}.idx.npy", mmap_mode="r")
        size = int(self.offsets[-1])
        self.blob = np.memmap(f"{stem}.bin", dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
        self.parse = parse

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> Any:
        text = bytes(self.blob[int(self.offsets[i]) : int(self.offsets[i + 1])]).decode("utf-8")
        return text if self.parse is None else self.parse(text)


class _StringWriter:
    def __init__(self, stem: Path) -> None:
        self.stem, self.file, self.offsets = stem, open(f"{stem}.bin", "wb"), [0]

    def add(self, text: str) -> None:
        data = text.encode("utf-8")
        self.file.write(data)
        self.offsets.append(self.offsets[-1] + len(data))

    def close(self) -> None:
        self.file.close()
        np.save(f"{self.stem}.idx.npy", np.asarray(self.offsets, dtype=np.int64))


def _build(data_cfg: DataConfig, key: str, path: str, processor: Any, out: Path) -> dict[str, Any]:
    assert data_cfg.seq_len is not None
    seq_len, pad = data_cfg.seq_len, processor.tokenizer.pad_token_id
    vocab = len(processor.tokenizer)
    records, root = records_of(data_cfg, key, path, seed=0)
    rows = RowWriter(out, seq_len, vocab, targets=True, positions=False)
    texts, images = _StringWriter(out / "texts"), _StringWriter(out / "images")
    pixels: list[int] = []
    too_long: list[tuple[str, int]] = []
    image_tokens = resized = count = 0
    try:
        def work(chunk: list[Any]) -> list[Any]:
            return list(processed(data_cfg, key, path, chunk, root, processor))

        for one in in_order(cache.counted(records, key, "processing"), work, build_processes()):
            if not all(isinstance(image, str) for image in one.images):
                raise NotFiles(one.where)
            if len(one.ids) > seq_len:
                too_long.append((one.where, len(one.ids)))
                continue
            rows.add(one.ids + [pad] * (seq_len - len(one.ids)), one.targets + [False] * (seq_len - len(one.ids)), None)
            texts.add(one.text)
            images.add(json.dumps(one.images))
            pixels.append(one.pixels)
            image_tokens += one.ids.count(processor.image_token_id)
            resized += one.resized
            count += len(one.images)
    finally:
        dtypes = rows.close()
        texts.close()
        images.close()
    if too_long:
        raise too_long_error(key, path, too_long, seq_len)
    if not rows.num_rows:
        raise ConfigError(f"{key}={path!r} holds no conversation")
    np.save(out / "pixels.npy", np.asarray(pixels, dtype=np.int64))
    return {"num_rows": rows.num_rows, "seq_len": seq_len, "dtypes": dtypes, "vocab_size": vocab,
            "image_tokens": image_tokens, "images": count, "resized": resized}  # fmt: skip
