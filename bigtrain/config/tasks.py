"""What a model is trained to do (``model.task``): one record per task, read by the build, the data path, the
objective, the capability table and export.

A task names the transformers Auto class the model is built with, what a batch holds (token rows, or examples with
one label each) and what the loss is normalised by over the global batch. The model's config carries the resolved
task as transformers itself records it, in ``architectures`` (e.g. ``["ResNetForImageClassification"]``): the build,
the engines and export read it from there (``task_of``), and the exported folder's config.json names the class that
``from_pretrained`` and ``pipeline`` load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bigtrain.errors import ConfigError


@dataclass(frozen=True)
class Task:
    name: str  # model.task
    auto_class: str  # the transformers Auto class the model is built with
    mapping: str  # the transformers mapping of model_type -> class name for that Auto class
    suffix: str | None  # how that class's name ends (e.g. ForImageClassification); None: its mapping alone says
    examples: bool  # a batch holds examples with one label each (not token rows)
    unit: str  # what throughput counts: tokens, images or examples
    counts: str  # what the loss is normalised by over the global batch, in words


CAUSAL_LM = Task(
    name="causal-lm",
    auto_class="AutoModelForCausalLM",
    mapping="MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    suffix="ForCausalLM",
    examples=False,
    unit="tokens",
    counts="labelled tokens",
)
IMAGE_CLASSIFICATION = Task(
    name="image-classification",
    auto_class="AutoModelForImageClassification",
    mapping="MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    suffix="ForImageClassification",
    examples=True,
    unit="images",
    counts="images",
)
SEQUENCE_CLASSIFICATION = Task(
    name="sequence-classification",
    auto_class="AutoModelForSequenceClassification",
    mapping="MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    suffix="ForSequenceClassification",
    examples=True,
    unit="examples",
    counts="examples",
)
# Chat rows whose user turns hold images: token rows as for a causal LM (the loss on the assistant's tokens), the
# processor's image tensors beside them. Its classes end in ForConditionalGeneration, as seq2seq models' do, so only
# transformers' image-text-to-text mapping names them.
IMAGE_TEXT_TO_TEXT = Task(
    name="image-text-to-text",
    auto_class="AutoModelForImageTextToText",
    mapping="MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    suffix=None,
    examples=False,
    unit="tokens",
    counts="labelled tokens",
)
# image-text-to-text first: Gemma 3's multimodal class is also transformers' causal LM class of model_type gemma3
TASKS: dict[str, Task] = {
    t.name: t for t in (IMAGE_TEXT_TO_TEXT, CAUSAL_LM, IMAGE_CLASSIFICATION, SEQUENCE_CLASSIFICATION)
}
AUTO = "auto"


def class_names(task: Task) -> dict[str, Any]:
    """model_type -> the class (name, or names) transformers builds for ``task``."""
    from transformers.models.auto import modeling_auto

    return dict(getattr(modeling_auto, task.mapping))


def _class_name(task: Task, model_type: str) -> str | None:
    name = class_names(task).get(model_type)
    if isinstance(name, (list, tuple)):  # a family with several classes for one task: the first is transformers' own
        name = name[0]
    return name


def serving(model_type: str) -> list[Task]:
    """The tasks transformers has a class of ``model_type`` for."""
    return [task for task in TASKS.values() if _class_name(task, model_type) is not None]


def detect_task(hf_config: Any) -> Task:
    """``model.task: auto``: the task of the class the config names (``architectures``, as a saved model folder has
    it); else, for a config without one (``model.config``), image-text-to-text for a config with a vision tower,
    causal-lm for a decoder family, otherwise the one task transformers serves it with (an encoder such as BERT,
    which transformers also lists as a causal LM: its sequence classifier)."""
    named = named_task(hf_config)
    if named is not None:
        return named
    if getattr(hf_config, "vision_config", None) is not None and IMAGE_TEXT_TO_TEXT in serving(hf_config.model_type):
        return IMAGE_TEXT_TO_TEXT  # a vision tower beside a language model (Gemma 3 is also listed as a causal LM)
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    tasks = serving(hf_config.model_type)
    if CAUSAL_LM in tasks and hf_config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return CAUSAL_LM
    if CAUSAL_LM in tasks and len(tasks) > 1:  # an encoder (BERT) that transformers also lists as a causal LM
        tasks.remove(CAUSAL_LM)
    if len(tasks) == 1:
        return tasks[0]
    if not tasks:
        raise ConfigError(
            f"model_type {hf_config.model_type!r} has no class for any task bigtrain trains "
            f"({', '.join(TASKS)}); use a causal LM, an image classifier or a sequence classifier"
        )
    raise ConfigError(
        f"model_type {hf_config.model_type!r} serves several tasks ({', '.join(t.name for t in tasks)}); say which "
        "with model.task"
    )


def resolve_task(hf_config: Any, asked: str, key: str) -> Task:
    """The task ``model.task`` asks for (``auto``: ``detect_task``), checked against the family, recorded in the
    config's ``architectures`` for every later reader (``task_of``)."""
    if asked == AUTO:
        task = detect_task(hf_config)
    elif asked in TASKS:
        task = TASKS[asked]
    else:
        raise ConfigError(f"model.task={asked!r} is not a task; use auto, {', '.join(TASKS)}")
    name = _class_name(task, hf_config.model_type)
    if name is None:
        could = ", ".join(t.name for t in serving(hf_config.model_type)) or "none bigtrain trains"
        raise ConfigError(
            f"{key}: model_type {hf_config.model_type!r} has no {task.name} class in transformers "
            f"(model.task={asked}); it serves: {could}"
        )
    hf_config.architectures = [name]
    return task


def model_class(hf_config: Any) -> Any:
    """The transformers class the config is built as (its task's class for its family), or None."""
    import transformers

    name = _class_name(task_of(hf_config), hf_config.model_type)
    return getattr(transformers, name, None) if name else None


def named_task(hf_config: Any) -> Task | None:
    """The task of the class the config's ``architectures`` names: by its name's ending, or as the class transformers
    builds for the family's task (BERT's causal LM is ``BertLMHeadModel``)."""
    for arch in getattr(hf_config, "architectures", None) or []:
        for task in TASKS.values():
            by_suffix = task.suffix is not None and arch.endswith(task.suffix)
            if by_suffix or arch == _class_name(task, hf_config.model_type):
                return task
    return None


def task_of(hf_config: Any) -> Task:
    """The task a config was resolved for (``resolve_task``); a config that names no class of ours is a causal LM
    (the planner's presets and the simulator's configs)."""
    return named_task(hf_config) or CAUSAL_LM


def layer_kinds(hf_config: Any) -> tuple[bool, bool]:
    """(has BatchNorm, has 2-D convolutions) of the config's classifier, built on meta; causal LMs: neither. A model
    with BatchNorm trains differently by how a batch is split over ranks (``parallel/transforms/batch_norm.py``)."""
    import copy

    import torch
    import transformers

    task = task_of(hf_config)
    if not task.examples:
        return False, False
    with torch.device("meta"):
        model = getattr(transformers, task.auto_class).from_config(copy.deepcopy(hf_config))
    modules = list(model.modules())
    return (
        any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in modules),
        any(isinstance(m, torch.nn.Conv2d) for m in modules),
    )
