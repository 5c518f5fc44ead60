"""What bigtrain trains models to do: one spec per task (``spec.TaskSpec``), one line each in ``RECORDS``.

Adding a task is one module here ending in ``TASK = TaskSpec(...)`` and its line below (``docs/architecture.md``):
the trainer, the planner, the simulator, export and the docs read it from there. ``detect`` and ``resolve`` turn a
model's config and ``model.task`` into a spec; the order of ``RECORDS`` is the order a config's ``architectures``
is matched in (a spec that names a class more narrowly goes before one that names it broadly).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from bigtrain.errors import ConfigError
from bigtrain.tasks.spec import EXAMPLES, TOKEN_ROWS, Prepared, TaskSpec

RECORDS = (
    "image_text_to_text",  # first: Gemma 3's multimodal class is also transformers' causal LM of model_type gemma3
    "causal_lm",
    "image_classification",
    "sequence_classification",
    "reward_model",  # named only (model.task: reward-model): a one-output sequence classifier
    "embedding",  # named only (model.task: embedding): a base model whose token states are pooled
    "text_to_image",  # named only (model.task: text-to-image): a diffusers transformer
)
TASKS: dict[str, TaskSpec] = {
    spec.name: spec for spec in (import_module(f"{__name__}.{name}").TASK for name in RECORDS)
}
AUTO = "auto"

__all__ = [
    "AUTO",
    "EXAMPLES",
    "TASKS",
    "TOKEN_ROWS",
    "Prepared",
    "TaskSpec",
    "detect",
    "named",
    "resolve",
    "task",
    "task_of_objective",
]


def task(name: str, key: str = "model.task") -> TaskSpec:
    """The spec of a task by its name; a ConfigError naming ``key`` and the tasks there are."""
    if name not in TASKS:
        raise ConfigError(f"{key}={name!r} is not a task; use {AUTO}, {', '.join(TASKS)}")
    return TASKS[name]


def named(hf_config: Any) -> TaskSpec | None:
    """The task whose class the config's ``architectures`` names (a saved model folder's, or ``resolve``'s)."""
    return next((spec for spec in TASKS.values() if spec.names_class(hf_config)), None)


def detect(hf_config: Any) -> TaskSpec:
    """``model.task: auto``: the task of the class the config names; else the first task that claims the family
    (``TaskSpec.auto`` True: a decoder family's causal LM, a config with a vision tower's image-text-to-text), else
    the one task transformers serves it with that does not refuse to be guessed (an encoder such as BERT, which
    transformers also lists as a causal LM: its sequence classifier)."""
    found = named(hf_config)
    if found is not None:
        return found
    serving = [spec for spec in TASKS.values() if spec.serves(hf_config.model_type)]
    claimed = [spec for spec in serving if spec.auto is True and _claims(spec, hf_config)]
    if claimed:
        return claimed[0]
    left = [spec for spec in serving if spec.auto is None]
    if len(left) == 1:
        return left[0]
    if not left:
        raise ConfigError(
            f"model_type {hf_config.model_type!r} has no class for any task bigtrain trains "
            f"({', '.join(TASKS)}); use a causal LM, an image classifier or a sequence classifier"
        )
    raise ConfigError(
        f"model_type {hf_config.model_type!r} serves several tasks ({', '.join(t.name for t in left)}); say which "
        "with model.task"
    )


def task_of_objective(detected: TaskSpec, objective: str, reads: str, model_type: str) -> TaskSpec:
    """The task ``detected`` unless ``objective`` reads other outputs than its model gives and is the own objective
    of exactly one task that serves ``model_type`` (a reward model's objective on a causal LM's family)."""
    if reads == detected.outputs:
        return detected
    own = [spec for spec in TASKS.values() if spec.default_objective == objective and spec.serves(model_type)]
    return own[0] if len(own) == 1 else detected


def _claims(spec: TaskSpec, hf_config: Any) -> bool:
    """Whether a spec with ``auto`` True claims this config (its ``claims`` hook, or any config it serves)."""
    return spec.claims is None or spec.claims(hf_config)


def resolve(hf_config: Any, asked: str, key: str = "model.config") -> TaskSpec:
    """The task ``model.task`` asks for (``auto``: ``detect``), checked against the family, and recorded in the
    config's ``architectures`` (the class the build makes and the exported folder names)."""
    spec = detect(hf_config) if asked == AUTO else task(asked)
    name = spec.class_name(hf_config.model_type)
    if name is None:
        could = ", ".join(t.name for t in TASKS.values() if t.serves(hf_config.model_type)) or "none bigtrain trains"
        raise ConfigError(
            f"{key}: model_type {hf_config.model_type!r} has no {spec.name} class in transformers "
            f"(model.task={asked}); it serves: {could}"
        )
    hf_config.architectures = [name]
    return spec
