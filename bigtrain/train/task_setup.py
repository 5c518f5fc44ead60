"""What a model's task adds to a run before anything is built: a classifier's labels from its data, and under LoRA
its head trained fully beside the adapters; a causal LM refuses the classifiers' options."""

from __future__ import annotations

import dataclasses
from typing import Any

from bigtrain.config.schema import RecipeConfig
from bigtrain.config.tasks import Task
from bigtrain.data.for_task import apply_labels
from bigtrain.errors import ConfigError


def prepare_task(cfg: RecipeConfig, hf_config: Any, task: Task, data: Any) -> tuple[RecipeConfig, str | None]:
    """The recipe as the run records it and a note to print (a pretrained head replaced), or a ConfigError."""
    if not task.examples:
        check_preference(cfg)
        if cfg.train.label_smoothing and cfg.train.objective == "sft":
            raise ConfigError(
                f"train.label_smoothing={cfg.train.label_smoothing} applies to classifiers; a causal LM's loss has "
                "none: set train.label_smoothing=0"
            )
        return cfg, None
    note = apply_labels(hf_config, data, cfg.model.name_or_path is not None)
    if cfg.train.method == "lora" and cfg.lora.modules_to_save is None:
        # the head is new or of the data's classes: adapters alone would leave it as initialised (peft's
        # sequence-classification default trains it fully too); recorded in the recipe, so the saved adapter's
        # config names it for peft
        lora = dataclasses.replace(cfg.lora, modules_to_save=classifier_head(hf_config))
        cfg = dataclasses.replace(cfg, lora=lora)
    return cfg, note


def classifier_head(hf_config: Any) -> list[str]:
    """The names of the linear layers that answer one output per label (outside the repeated blocks)."""
    from bigtrain.config.hf import classifier_heads
    from bigtrain.models.build import build_meta_model

    return classifier_heads(build_meta_model(hf_config, "auto"), hf_config.num_labels)


def check_preference(cfg: RecipeConfig) -> None:
    """What the capability table cannot see of a preference recipe: the lora section. Modules trained fully beside
    the adapters (lora.modules_to_save) are updated in place, so switching the adapters off no longer gives the
    starting model: the adapter-disabled reference (asked, or auto's choice for a written plan) is refused;
    ``plan: auto`` does not weigh it (``capabilities/preference.py``)."""
    from bigtrain.config.capabilities.preference import REFERENCE
    from bigtrain.config.schema import ADAPTER_METHODS, REFERENCE_OBJECTIVES

    if cfg.train.objective not in REFERENCE_OBJECTIVES or not cfg.lora.modules_to_save:
        return
    asked = cfg.parallel.options.get(REFERENCE.name, REFERENCE.default)
    adapters = cfg.train.method in ADAPTER_METHODS
    if asked == "adapter_disabled" or (asked == "auto" and adapters and cfg.parallel.plan != "auto"):
        raise ConfigError(
            f"parallel.reference={asked} with lora.modules_to_save={cfg.lora.modules_to_save}: those modules train "
            "fully, so the adapters switched off are no longer the starting model; set parallel.reference="
            "precomputed, or unset lora.modules_to_save"
        )


def check_model_against_rows(cfg: RecipeConfig, hf_config: Any, seq_len: int, is_main: bool) -> None:
    """A token-row model's checks against its recipe and rows, before any process group: one block on meta (a bad
    attn_implementation fails here, and it shows the position embedding), the lora section's module names and
    model.freeze's against the model, the row length against the language model's positions."""
    from bigtrain.config.hf import one_block
    from bigtrain.config.model_parts import frozen_parameters, language_config, part_module
    from bigtrain.config.schema import ADAPTER_METHODS
    from bigtrain.config.tasks import IMAGE_TEXT_TO_TEXT, task_of
    from bigtrain.models.build import build_meta_model
    from bigtrain.parallel.transforms.adapters import modules_trained_fully, target_modules
    from bigtrain.train.checks import check_sequence_length

    probe = build_meta_model(one_block(hf_config), cfg.model.attn_implementation)
    if cfg.train.method in ADAPTER_METHODS:
        # lora.target_modules or modules_to_save naming nothing that works: one line, before any group
        modules_trained_fully(probe, cfg.lora, target_modules(probe, cfg.lora))
    vision_language = task_of(hf_config) is IMAGE_TEXT_TO_TEXT
    if cfg.model.freeze and not vision_language:
        raise ConfigError(
            f"model.freeze={cfg.model.freeze} names parts of a vision-language model (model.task: "
            f"image-text-to-text); this model is a {task_of(hf_config).name}: leave model.freeze empty"
        )
    if cfg.model.freeze:
        frozen_parameters(probe, cfg.model.freeze)  # a name the model lacks: one line listing what it has
    text_config = language_config(hf_config)
    # the rows are the language model's (a vision tower has positions of its own)
    positions = part_module(probe, "language_model") if vision_language else probe
    check_sequence_length(text_config, positions, seq_len, is_main=is_main)


def with_images(workload: Any, data: Any, cfg: RecipeConfig) -> Any:
    """The workload with the images a run's data holds, as the planner models them: an image classifier's side, a
    vision-language model's images per row and their mean size as the processor sizes them (and its frozen parts)."""
    from bigtrain.data.image_chat import ImageChats

    images = getattr(data, "preprocessing", None)  # an image classifier's: the side it is trained at
    if images is not None:
        return dataclasses.replace(workload, image_size=images.size)
    if isinstance(data, ImageChats):
        frozen = tuple(cfg.model.freeze)
        return dataclasses.replace(
            workload, image_size=data.image_side, images_per_row=data.images_per_row, frozen=frozen
        )
    return workload
