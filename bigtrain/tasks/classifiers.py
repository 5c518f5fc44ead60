"""What the classification tasks share (image-classification, sequence-classification): examples with one label
each, trained on data-parallel plans (DDP, FSDP2, HSDP, DeepSpeed ZeRO), the head sized by the data's classes.

Everything a causal LM's plan may add beyond data parallelism is a row here until it is built for these tasks: each
of tp, pp, cp and ep splits a decoder's blocks, heads or sequence; the chunked and vocabulary-parallel losses work on
an LM head; FP8, activation offload and QLoRA wrap or rewrite decoder blocks and are tested on causal LMs only.
Activation checkpointing and compile wrap a classifier's blocks (its ``_no_split_modules``) unless it has BatchNorm
(``config/capabilities/batch_norm.py``); LoRA adapts the linears of its blocks, its head trained fully.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from bigtrain.config.capabilities.table import first_unbuilt, row, split_settings
from bigtrain.config.schema import RecipeConfig
from bigtrain.config.setup import Setup
from bigtrain.errors import ConfigError
from bigtrain.tasks.spec import Prepared

log = logging.getLogger(__name__)


def read_examples(cfg: RecipeConfig, hf_config: Any, read: Any) -> tuple[Any, Any]:
    """Examples of ``data.path`` and the held-out ones (``read(key, path)`` reads one source), of the same classes;
    the training split augmented where the recipe says."""
    import numpy as np

    from bigtrain.data.held_out import require_held_out
    from bigtrain.data.sources import held_out_rows

    data_cfg = cfg.data
    augment = data_cfg.augment == "crop_flip"
    data = read("data.path", data_cfg.path)
    held = None
    if data_cfg.eval_path is not None:
        held = read("data.eval_path", data_cfg.eval_path)
        missing = [name for name in data.class_names if name not in held.class_names]
        held = held.in_classes(data.class_names, f"data.eval_path={data_cfg.eval_path!r}")
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            log.info(
                "data.eval_path has no example of %d of the %d training classes (%s): it is evaluated as it is "
                "(macro-F1 over the classes its labels or the model's predictions hold)",
                len(missing),
                len(data.class_names),
                shown,
            )
    elif data_cfg.eval_fraction > 0:
        kept, chosen = held_out_rows(data.num_rows, data_cfg.eval_fraction, cfg.train.seed, "examples")
        held = data.subset(chosen, f"{len(chosen)} held-out examples", augment=False)
        data = data.subset(kept, f"{data.description}, {len(kept)} for training", augment=augment)
    if data.index is None:
        data = data.subset(np.arange(data.num_rows), data.description, augment=augment)
    require_held_out(cfg, held)
    return data, held


def prepare(cfg: RecipeConfig, hf_config: Any, data: Any) -> Prepared:
    """The data's classes in a copy of the model's config (``num_labels``, ``id2label``, ``label2id``), so the head
    has one output per class and the exported model names them; for texts, the id they are padded with (a
    decoder's score head reads the last token before it). A pretrained folder's head of another number of labels
    starts afresh (said in a note), as transformers' ``ignore_mismatched_sizes`` does. Under LoRA the head trains
    fully beside the adapters (recorded in the recipe, so the saved adapter's config names it for peft)."""
    import copy

    hf_config = copy.deepcopy(hf_config)
    class_names = data.class_names
    pad_id = getattr(data, "pad_id", None)
    if pad_id is not None:
        hf_config.pad_token_id = pad_id
    hf_config.id2label = dict(enumerate(class_names))
    hf_config.label2id = {name: i for i, name in enumerate(class_names)}
    notes: tuple[str, ...] = ()
    new_head = False
    if cfg.model.name_or_path is not None:
        saved = json.loads((Path(cfg.model.name_or_path) / "config.json").read_text())
        before = len(saved.get("id2label") or {})
        new_head = before != len(class_names)
        if new_head:
            notes = (
                f"the model's head has {before} labels and the data {len(class_names)} classes: the head is "
                f"replaced by a new one of {len(class_names)} outputs, initialised as transformers does",
            )
    if cfg.train.method == "lora" and cfg.lora.modules_to_save is None:
        # the head is new or of the data's classes: adapters alone would leave it as initialised (peft's
        # sequence-classification default trains it fully too)
        cfg = dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, modules_to_save=head_modules(hf_config)))
    return Prepared(cfg, hf_config, notes, new_head)


def head_modules(hf_config: Any) -> list[str]:
    """The names of the linear layers that answer one output per label (outside the repeated blocks)."""
    from bigtrain.config.hf import classifier_heads
    from bigtrain.models.build import build_meta_model

    return classifier_heads(build_meta_model(hf_config, "auto"), hf_config.num_labels)


def layer_facts(hf_config: Any) -> dict[str, bool]:
    """Whether the classifier has BatchNorm (its statistics depend on how a batch is split), 2-D convolutions (what
    channels-last lays out) and linear layers in its blocks (what LoRA adapts), from its model on meta."""
    import torch

    from bigtrain.config.hf import linear_names
    from bigtrain.models.build import build_meta_model

    model = build_meta_model(hf_config, "auto")
    modules = list(model.modules())
    return {
        "batch_norm": any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in modules),
        "convolutional": any(isinstance(m, torch.nn.Conv2d) for m in modules),
        "block_linears": bool(linear_names(model)[0]),
    }


def count_examples(batch: Any, workload: Any, plan: Any) -> float:
    """A global batch counts its examples."""
    return float(workload.global_batch_size)


def synthetic_examples(hf_config: Any, plan: Any, workload: Any, device: Any) -> Any:
    """A classifier's micro-batch as its data path makes it: float images at the workload's size (channels first),
    or token rows of the workload's length with their attention mask; one label per example."""
    import torch

    from bigtrain.data.batch import ExampleBatch
    from bigtrain.planner.classifier_stats import example_inputs

    b, side = plan.micro_batch_size, workload.image_size
    if workload.job.unit == "images" and not side:
        raise ConfigError("an image classifier's step is simulated at an image size: set Workload.image_size")
    inputs = example_inputs(hf_config, b, side, 0 if side else workload.seq_len, device)
    return ExampleBatch(inputs, torch.randint(0, hf_config.num_labels, (b,), device=device))


def planner(model_config: dict[str, Any], workload: Any) -> Any:
    """Its statistics measured on fake tensors at the workload's size (``planner/classifier_stats.py``) and the
    classifier's memory and time terms (``planner/classifier_plan.py``)."""
    from bigtrain.planner.classifier_plan import classifier_model

    return classifier_model(model_config, workload)


def classifier_with_model_parallelism(s: Setup) -> str | None:
    assert s.job is not None
    task = s.job.task
    for key, value, default in split_settings(s.plan):
        if value != default:
            return (
                f"parallel.{key}={str(value).lower()} with model.task={task} is not built yet (it splits a causal "
                f"LM's blocks, heads or sequence); train {task} with data parallelism: backend ddp, fsdp2 or "
                f"deepspeed, parallel.{key}={str(default).lower()}"
            )
    return None


def classifier_with_block_transforms(s: Setup) -> str | None:
    assert s.job is not None
    p, t = s.plan, s.train
    return first_unbuilt(
        s.job.task,
        (
            ("parallel.offload_activations", "true", p.offload_activations, "false"),
            ("train.fp8", t.fp8, t.fp8 not in ("none", "auto"), "none"),
            ("train.method", t.method, t.method not in ("full", "auto", "lora"), "full (or lora)"),
        ),
    )


RULES = (
    row(classifier_with_model_parallelism, "not_built", reads_job=True),
    row(classifier_with_block_transforms, "not_built", reads_job=True),
)
KEYS = ("data.label_field", "data.seq_len", "data.eval_path", "data.eval_fraction")


# examples per GPU in a step when no batch is given: NVIDIA's ResNet-50 AMP recipe takes 256 images per GPU; BERT
# fine-tuning recipes take 32 sequences
DEFAULT_PER_GPU = {"images": 256, "examples": 32}
DEFAULT_SEQ_LEN = 512


def sizes(ask: Any, images: bool) -> dict[str, Any]:
    """A classifier's step as the planner is asked it: an image classifier's image side (the argument, the recipe's
    data.image_size, the model's own image_size, else 224), or a sequence classifier's row length (the argument, the
    recipe's data.seq_len, else 512, within the model's positions); the global batch (the argument, the recipe's,
    else a recipe's usual examples per GPU), split evenly over the GPUs."""
    cfg, spell, model_config = ask.recipe, ask.spell, ask.model_config
    if images:
        if ask.seq_len:
            raise ConfigError(
                f"{spell('seq_len')} is for rows of tokens; an image classifier takes {spell('image_size')}"
            )
        side = ask.image_size or (cfg and cfg.data.image_size) or model_config.get("image_size") or 224
        if side < 8:
            raise ConfigError(f"{spell.value('image_size', side)} is too small; use at least 8 (224 for ImageNet)")
        size = {"image_size": side, "seq_len": 1}
    else:
        if ask.image_size or ask.images_per_row:
            raise ConfigError(f"{spell('image_size')} is for image models; a sequence classifier takes --seq-len")
        length = ask.seq_len or (cfg and cfg.data.seq_len) or DEFAULT_SEQ_LEN
        limit = model_config.get("max_position_embeddings")
        if limit and length > limit:
            raise ConfigError(f"{spell.value('seq_len', length)} is more than the model's {limit} positions")
        size = {"seq_len": length}
    n = ask.gpus
    batch = ask.global_batch_size or (cfg.train.global_batch_size if cfg else 0)
    batch = batch or DEFAULT_PER_GPU["images" if images else "examples"] * n
    if batch % n:
        lower = batch // n * n
        raise ConfigError(
            f"{spell.value('global_batch_size', batch)} does not divide over {n} GPUs; try {lower or n} or {lower + n}"
        )
    return {**size, "global_batch_size": batch}
