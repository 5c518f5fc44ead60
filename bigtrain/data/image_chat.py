"""Conversations whose user turns hold images (``model.task: image-text-to-text``), through the model's processor.

A record is ``{"messages": [...]}`` whose contents mix ``{"type": "text", "text": ...}`` and ``{"type": "image",
"image": PATH}`` items (a path relative to the data file), or ``{"type": "image"}`` items taking the record's
``images`` (or ``data.image_field``) list in order, as TRL's vision datasets do; a HF dataset's image column may hold
the images themselves. Each conversation is rendered with the processor's chat template; the processor expands each
image placeholder into the image's tokens (as many as its resolution gives) and makes the pixel tensors. The loss is
on the assistant's tokens only: where they are is found in the rendered text (``chat_targets``), on the tokens of
the text before expansion, and carried over to the expanded tokens, which differ only where images were expanded.
Image tokens are never labels.

Every conversation is processed once when the data is read, so a missing image, a placeholder count that does not
match the images, or a row longer than ``data.seq_len`` is said before training starts; its token row and labels are
kept (in the data cache when its images are files: data/image_chat_cache.py), its images are processed again
whenever a micro-batch holds it (with ``data.workers``, ahead of the step).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigtrain.config.schema import DataConfig
from bigtrain.data.batch import ImageChatBatch
from bigtrain.data.indexed_rows import IndexedRows
from bigtrain.data.labels import masked_next_token_labels
from bigtrain.data.pixels import rgb
from bigtrain.data.processor import image_token_ids, pixel_budget, placeholder_token
from bigtrain.data.records import check_records_path, read_records
from bigtrain.data.tokenizer import assistant_spans, targets_in
from bigtrain.errors import ConfigError

BUILTIN_PREFIX = "builtin:"
Image = Any  # a PIL image, or a [H, W, 3] uint8 array (the built-in set)


@dataclass
class ImageChats(IndexedRows):
    """Conversations with images, as expanded token rows, their targets, and the images to process again."""

    processor: Any
    texts: Sequence[str]  # each conversation through the chat template (image placeholders not expanded)
    images: Sequence[list[Image | str]]  # each conversation's images in placeholder order (paths read when used)
    ids: np.ndarray  # [conversations, seq_len] int32 (or mapped from the cache), image tokens expanded, right-padded
    targets: np.ndarray  # [conversations, seq_len] bool: the assistant's tokens
    vocab_size: int
    description: str
    index: np.ndarray | None = None  # the conversations of ``ids`` these are, in order; None: all
    image_tokens: int = 0  # over every conversation (the planner's and the table's unit)
    image_count: int = 0  # images over every conversation
    resized: int = 0  # images outside the processor's pixel budget, resized into it
    # [conversations] each one's images' pixels as the processor sizes them (within its budget): what its tower work
    # grows with, and (over all of them) what the planner reads
    row_pixels: np.ndarray | None = None
    truncated: int = 0  # never: a longer conversation is refused
    examples: int = 0
    positions: None = None  # never packed
    cache_note: str | None = None  # where the data cache entry is and whether this start built it

    @property
    def seq_len(self) -> int:
        return int(self.ids.shape[1])

    @property
    def images_per_row(self) -> float:
        return self.image_count / max(len(self.ids), 1)

    @property
    def row_costs(self) -> np.ndarray | None:
        """Each row's cost to compute (its images' pixels): the global order balances the ranks' and micro-steps'."""
        return None if self.row_pixels is None else self.row_pixels[self.at(np.arange(self.num_rows))]

    @property
    def image_side(self) -> int:
        """The side of a square image of the mean size (pixels), as the planner models images."""
        count = self.image_count
        pixels = 0 if self.row_pixels is None else int(self.row_pixels.sum())
        return round((pixels / count) ** 0.5) if count else 0

    def micro_batch(self, rows: np.ndarray, seen: np.ndarray | None = None) -> ImageChatBatch:
        """Conversations ``rows`` as one micro-batch, their images processed again (as when they were read)."""
        at = [int(i) for i in self.at(rows)]
        out = _process(self.processor, [self.texts[i] for i in at], [_opened(self.images[i]) for i in at], self.seq_len)
        ids = out.pop("input_ids")
        if not torch.equal(ids, torch.from_numpy(self.ids[at].astype(np.int64))):
            changed = f" (an image rewritten since {self.cache_note}? remove that entry)" if self.cache_note else ""
            raise RuntimeError(
                f"the processor expanded a conversation's images into other tokens than when it was read{changed}"
            )
        return ImageChatBatch(ids, masked_next_token_labels(ids, self.targets[at]), dict(out))


@dataclass
class Processed:
    """One conversation as read: its rendered text, images (as named: paths resolved against the data's folder),
    expanded ids (not padded) and which are the assistant's, its images' pixels in the processor's budget."""

    where: str
    text: str
    images: list[Any]
    ids: list[int]
    targets: list[bool]
    pixels: int
    resized: int  # its images outside the processor's pixel budget


def records_of(data_cfg: DataConfig, key: str, path: str, seed: int) -> tuple[Any, Path]:
    """The records at ``path`` (or the built-in set, generated with ``seed``) and the folder image paths are
    relative to."""
    if path.startswith(BUILTIN_PREFIX):
        from bigtrain.data.builtin_images import image_chat_records

        return image_chat_records(path[len(BUILTIN_PREFIX) :], seed=seed), Path.cwd()
    check_records_path(key, path)
    root = Path(path).parent if Path(path).is_file() else Path(path)
    return read_records(key, path, data_cfg.text_field, data_cfg.split), root


def processed(
    data_cfg: DataConfig, key: str, path: str, records: Iterable[Any], root: Path, processor: Any
) -> Iterator[Processed]:
    """Each record rendered, its images opened and checked, expanded by the processor (see the module's docstring)."""
    placeholder = placeholder_token(processor)
    never = image_token_ids(processor)
    budget = pixel_budget(processor.image_processor)
    for where, record in records:
        messages, pictures = conversation_of(key, path, where, record, data_cfg.image_field)
        text, spans = assistant_spans(_renderer(processor), messages)
        if text.count(placeholder) != len(pictures):
            raise ConfigError(
                f"{key}={path!r} {where}: {len(pictures)} images but {text.count(placeholder)} image placeholders "
                f"({placeholder}) in its rendered text; each image item of the messages is one placeholder"
            )
        opened = _opened(pictures, root, f"{key}={path!r} {where}")
        pixels = resized = 0
        for image in opened:
            budgeted = _budgeted_pixels(budget, image)
            resized += budgeted != image.size[0] * image.size[1]
            pixels += budgeted
        ids = _process(processor, [text], [opened], None)["input_ids"][0].tolist()
        marked = _expanded_targets(processor.tokenizer, text, spans, ids, where)
        marked = [m and i not in never for m, i in zip(marked, ids, strict=True)]
        # read again from any working directory
        yield Processed(where, text, [_resolved(p, root) for p in pictures], ids, marked, pixels, resized)


def too_long_error(key: str, path: str, too_long: list[tuple[str, int]], seq_len: int) -> ConfigError:
    where, longest = max(too_long, key=lambda t: t[1])
    return ConfigError(
        f"{key}={path!r}: {len(too_long)} conversations are longer than data.seq_len={seq_len} with their image "
        f"tokens (the longest, {where}, {longest}); raise data.seq_len to {longest} or shrink the images "
        "(data.max_pixels where the family has a pixel budget)"
    )


def in_memory(
    data_cfg: DataConfig, key: str, path: str, processor: Any, records: Iterable[Any], root: Path
) -> ImageChats:
    """The conversations processed and held in this process (the built-in set's, or a dataset's own images)."""
    assert data_cfg.seq_len is not None
    seq_len, pad = data_cfg.seq_len, processor.tokenizer.pad_token_id
    texts, images, rows, targets, image_tokens, resized = [], [], [], [], 0, 0
    row_pixels: list[int] = []
    too_long: list[tuple[str, int]] = []
    for one in processed(data_cfg, key, path, records, root, processor):
        if len(one.ids) > seq_len:
            too_long.append((one.where, len(one.ids)))
            continue
        image_tokens += one.ids.count(processor.image_token_id)
        resized += one.resized
        row_pixels.append(one.pixels)
        texts.append(one.text)
        images.append(one.images)
        rows.append(one.ids + [pad] * (seq_len - len(one.ids)))
        targets.append(one.targets + [False] * (seq_len - len(one.ids)))
    if too_long:
        raise too_long_error(key, path, too_long, seq_len)
    if not texts:
        raise ConfigError(f"{key}={path!r} holds no conversation")
    count = len(texts)
    return ImageChats(
        processor=processor,
        texts=texts,
        images=images,
        ids=np.asarray(rows, dtype=np.int32),
        targets=np.asarray(targets, dtype=bool),
        vocab_size=len(processor.tokenizer),
        description=described(path, count, sum(map(len, images)), image_tokens),
        image_tokens=image_tokens,
        image_count=sum(map(len, images)),
        resized=resized,
        row_pixels=np.asarray(row_pixels, dtype=np.int64),
        examples=count,
    )


def described(path: str, count: int, images: int, image_tokens: int) -> str:
    return f"{path} ({count} conversations, {images} images, {image_tokens} image tokens)"


def conversation_of(key: str, path: str, where: str, record: dict[str, Any], image_field: str) -> tuple[list, list]:
    """The record's messages with each image item as a bare placeholder (what chat templates render), and its
    images in placeholder order: an item's own ``image``/``path``, else the next of the record's image list."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ConfigError(
            f"{key}={path!r} {where} has no 'messages' list; an image conversation is {{'messages': [...]}}"
        )
    listed = record.get("images", record.get(image_field)) or []
    listed = list(listed) if isinstance(listed, (list, tuple)) else [listed]
    pictures: list[Any] = []
    taken = 0  # images taken from the list
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            out.append(message)
            continue
        items = []
        for item in content or []:
            if item.get("type") != "image":
                items.append(item)
                continue
            named = item.get("image", item.get("path"))
            if named is None:
                if taken == len(listed):
                    raise ConfigError(
                        f"{key}={path!r} {where}: more image items in its messages than images in its "
                        f"'images'/{image_field!r} list ({len(listed)})"
                    )
                named, taken = listed[taken], taken + 1
            pictures.append(named)
            items.append({"type": "image"})
        out.append({**message, "content": items})
    if taken != len(listed):
        raise ConfigError(
            f"{key}={path!r} {where}: {len(listed)} images in its 'images'/{image_field!r} list but {taken} image "
            "items in its messages take them; give one image item per image"
        )
    return out, pictures


def _resolved(picture: Any, root: Path) -> Any:
    """A picture named by a path relative to the data, as an absolute path (anything else as it is)."""
    if isinstance(picture, (str, Path)) and not Path(picture).is_absolute():
        return str((root / picture).resolve())
    if isinstance(picture, dict) and isinstance(picture.get("path"), str):
        return _resolved(picture["path"], root)
    return picture


def _opened(pictures: list[Any], root: Path | None = None, where: str = "") -> list[Any]:
    from PIL import Image as PILImage

    opened = []
    for picture in pictures:
        if isinstance(picture, np.ndarray):
            opened.append(PILImage.fromarray(picture))
        elif isinstance(picture, (str, Path)):
            file = Path(picture) if root is None or Path(picture).is_absolute() else root / picture
            if not file.is_file():
                raise ConfigError(f"{where} names the image {str(picture)!r}, which does not exist ({file})")
            try:
                with PILImage.open(file) as image:
                    opened.append(rgb(image))
            except (OSError, PILImage.DecompressionBombError) as e:
                raise ConfigError(f"{where}: the image {str(picture)!r} cannot be read ({e})") from e
        elif isinstance(picture, dict) and "path" in picture:  # a HF Image column not decoded
            opened += _opened([picture["path"]], root, where)
        else:
            opened.append(rgb(picture) if hasattr(picture, "convert") else picture)
    return opened


def _budgeted_pixels(budget: tuple[int, int] | None, image: Any) -> int:
    """An image's pixels as a dynamic-resolution processor resizes it (into its ``budget``); else as it is."""
    pixels = image.size[0] * image.size[1]
    return pixels if budget is None else min(max(pixels, budget[0]), budget[1])


def _process(processor: Any, texts: list[str], images: list[list[Any]], seq_len: int | None) -> dict[str, Any]:
    padding = {"padding": "max_length", "max_length": seq_len} if seq_len else {}
    has_images = any(images)
    out = processor(text=texts, images=images if has_images else None, return_tensors="pt", **padding)
    return dict(out)


def _renderer(processor: Any) -> Any:
    def render(messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    return render


def _expanded_targets(
    tokenizer: Any, text: str, spans: list[tuple[int, int]], expanded: list[int], where: str
) -> list[bool]:
    """Which of the expanded ids are the assistant's: marked on the text's own tokens (``targets_in``), then
    carried over along the runs of tokens the two sequences share (everything but the expanded images)."""
    plain = tokenizer(text, return_offsets_mapping=True)
    marked = targets_in(spans, plain["offset_mapping"])
    out = [False] * len(expanded)
    matcher = difflib.SequenceMatcher(None, plain["input_ids"], expanded, autojunk=False)
    carried = 0
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            if marked[block.a + k]:
                out[block.b + k] = True
                carried += 1
    if carried != sum(marked):
        raise ConfigError(
            f"{where}: the processor changed the assistant's tokens when it expanded the images; bigtrain cannot "
            "tell which tokens to train on"
        )
    return out
