"""The training and held-out data of a recipe, read as its model's task needs (``config/tasks.py``): token rows for a
causal LM, images or texts with one label each for a classifier."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bigtrain.config.capabilities.preference import without_log_probabilities
from bigtrain.config.schema import PREFERENCE_OBJECTIVES, RecipeConfig
from bigtrain.config.tasks import IMAGE_CLASSIFICATION, IMAGE_TEXT_TO_TEXT, Task
from bigtrain.data.image_chat import ImageChats, load_image_chats
from bigtrain.data.images import ImageExamples, Preprocessing, load_image_examples
from bigtrain.data.preference import PreferencePairs, load_preference_pairs
from bigtrain.data.sources import TokenRows, check_vocabulary, held_out_rows, hold_out, load_token_rows
from bigtrain.data.text_classes import TextExamples, load_text_examples, tokenizer_folder
from bigtrain.errors import ConfigError

Examples = ImageExamples | TextExamples
Data = TokenRows | Examples | PreferencePairs | ImageChats


def load_training_data(cfg: RecipeConfig, hf_config: Any, task: Task) -> tuple[Data, Data | None]:
    """The training rows or examples and the held-out ones (data.eval_path, or data.eval_fraction of data.path)."""
    data_cfg = cfg.data
    if cfg.train.objective in PREFERENCE_OBJECTIVES:
        return _pairs(cfg, hf_config, task)
    if task.examples:
        return _examples(cfg, hf_config, task)
    if task is IMAGE_TEXT_TO_TEXT:
        return _image_chats(cfg, hf_config)
    vocab = hf_config.vocab_size
    data = load_token_rows(data_cfg)
    check_vocabulary(data, vocab, data_cfg.path)
    held: TokenRows | None = None
    if data_cfg.eval_path is not None:
        held = load_token_rows(data_cfg, "data.eval_path", data_cfg.eval_path)
        check_vocabulary(held, vocab, data_cfg.eval_path, key="data.eval_path")
        if held.seq_len != data.seq_len:
            raise ConfigError(
                f"data.eval_path={data_cfg.eval_path!r} has rows of {held.seq_len} tokens but data.path of "
                f"{data.seq_len}; evaluate on rows of the training length"
            )
    elif data_cfg.eval_fraction > 0:
        data, held = hold_out(data, data_cfg.eval_fraction, cfg.train.seed)
    _require_held_out(cfg, held)
    return data, held


def _pairs(cfg: RecipeConfig, hf_config: Any, task: Task) -> tuple[PreferencePairs, PreferencePairs | None]:
    if task.examples:
        raise ConfigError(without_log_probabilities(cfg.train.objective, task.name))
    data_cfg = cfg.data

    def read(key: str, path: str) -> PreferencePairs:
        pairs = load_preference_pairs(data_cfg, key, path)
        check_vocabulary(pairs, hf_config.vocab_size, path, key=key)
        return pairs

    return _with_held_out(cfg, read("data.path", data_cfg.path), read, "pairs")


def _image_chats(cfg: RecipeConfig, hf_config: Any) -> tuple[ImageChats, ImageChats | None]:
    from bigtrain.data.processor import load_processor

    data_cfg = cfg.data
    folder = data_cfg.processor or cfg.model.name_or_path
    if folder is None:
        raise ConfigError(
            "model.task=image-text-to-text reads its data through the model's processor: set data.processor to its "
            "folder (model.config builds no processor)"
        )
    key = "data.processor" if data_cfg.processor else "model.name_or_path"
    processor = load_processor(folder, key, data_cfg.min_pixels, data_cfg.max_pixels)
    vocab = hf_config.get_text_config().vocab_size
    if len(processor.tokenizer) > vocab:
        raise ConfigError(
            f"{key}={folder!r}: the processor's tokenizer has {len(processor.tokenizer)} ids but the language "
            f"model's vocab_size is {vocab}; use the model's own processor"
        )
    data = load_image_chats(data_cfg, "data.path", data_cfg.path, processor, cfg.train.seed)

    def read_held_out(key: str, path: str) -> ImageChats:
        return load_image_chats(data_cfg, key, path, processor, cfg.train.seed + 1)

    return _with_held_out(cfg, data, read_held_out, "conversations")


def _with_held_out(cfg: RecipeConfig, data: Any, read: Callable[[str, str], Any], noun: str) -> tuple[Any, Any]:
    """Rows of whole examples and the held-out ones: ``read`` of data.eval_path, else a seeded data.eval_fraction of
    ``data`` (``noun`` names what a row is in the descriptions and errors)."""
    held = None
    if cfg.data.eval_path is not None:
        held = read("data.eval_path", cfg.data.eval_path)
    elif cfg.data.eval_fraction > 0:
        kept, chosen = held_out_rows(data.num_rows, cfg.data.eval_fraction, cfg.train.seed, noun)
        held = data.subset(chosen, f"{len(chosen)} held-out {noun}")
        data = data.subset(kept, f"{data.description}, {len(kept)} for training")
    _require_held_out(cfg, held)
    return data, held


def _require_held_out(cfg: RecipeConfig, held: Data | None) -> None:
    if cfg.train.eval_every > 0 and held is None:
        raise ConfigError(
            f"train.eval_every={cfg.train.eval_every} needs held-out data: set data.eval_path or "
            "data.eval_fraction (e.g. 0.05)"
        )


def _examples(cfg: RecipeConfig, hf_config: Any, task: Task) -> tuple[Examples, Examples | None]:
    data_cfg, model_folder = cfg.data, cfg.model.name_or_path
    augment = data_cfg.augment == "crop_flip"
    if task is IMAGE_CLASSIFICATION:
        preprocessing = Preprocessing.of(data_cfg, model_folder, hf_config)

        def read(key: str, path: str) -> Examples:
            return load_image_examples(data_cfg, key, path, preprocessing, cfg.train.seed)
    else:
        tokenizer = tokenizer_folder(data_cfg, model_folder)

        def read(key: str, path: str) -> Examples:
            return load_text_examples(data_cfg, key, path, tokenizer)

    data = read("data.path", data_cfg.path)
    held: Examples | None = None
    if data_cfg.eval_path is not None:
        held = read("data.eval_path", data_cfg.eval_path)
        if held.class_names != data.class_names:
            raise ConfigError(
                f"data.eval_path={data_cfg.eval_path!r} has the classes {held.class_names} but data.path "
                f"{data.class_names}; evaluate on the classes trained on"
            )
    elif data_cfg.eval_fraction > 0:
        kept, chosen = held_out_rows(data.num_rows, data_cfg.eval_fraction, cfg.train.seed, "examples")
        held = data.subset(chosen, f"{len(chosen)} held-out examples", augment=False)
        data = data.subset(kept, f"{data.description}, {len(kept)} for training", augment=augment)
    if data.index is None:
        data = data.subset(np.arange(data.num_rows), data.description, augment=augment)
    _require_held_out(cfg, held)
    vocab = getattr(hf_config, "vocab_size", None)
    if isinstance(data, TextExamples) and vocab is not None and data.vocab_size > vocab:
        raise ConfigError(
            f"the tokenizer has {data.vocab_size} ids but the model's vocab_size is {vocab}; set "
            f"model.config.vocab_size >= {data.vocab_size} or use a matching data.tokenizer"
        )
    return data, held


def apply_labels(hf_config: Any, data: Examples, pretrained: bool) -> str | None:
    """The data's classes in the model's config (``num_labels``, ``id2label``, ``label2id``), so the classifier's
    head has one output per class and the exported model names them; for texts, the id they are padded with
    (``pad_token_id``: a decoder's score head reads the last token before it). Returns a note when a pretrained
    folder's head has another number of labels: that head starts afresh (``load_values``), as transformers'
    ``ignore_mismatched_sizes`` does."""
    class_names = data.class_names
    if isinstance(data, TextExamples):
        hf_config.pad_token_id = data.pad_id
    before = len(getattr(hf_config, "id2label", {}) or {})
    hf_config.id2label = dict(enumerate(class_names))
    hf_config.label2id = {name: i for i, name in enumerate(class_names)}
    if not pretrained or before == len(class_names):
        return None
    return (
        f"the model's head has {before} labels and the data {len(class_names)} classes: the head is replaced by "
        f"a new one of {len(class_names)} outputs, initialised as transformers does"
    )
