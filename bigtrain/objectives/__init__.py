"""What a training step minimises: one spec per objective (``spec.ObjectiveSpec``), one line each in ``RECORDS``.

Adding an objective is one module here ending in ``OBJECTIVE = ObjectiveSpec(...)`` and its line below
(``docs/architecture.md``). The losses themselves live in ``bigtrain/losses`` (or in the spec's own module).
"""

from __future__ import annotations

from importlib import import_module

from bigtrain.errors import ConfigError
from bigtrain.objectives.spec import ObjectiveSpec

RECORDS = (
    "sft",
    "classification",
    "dpo",
    "ipo",
    "orpo",
    "simpo",
    "reward",
    "grpo",
    "contrastive",
    "flow_matching",
)
OBJECTIVES: dict[str, ObjectiveSpec] = {
    spec.name: spec for spec in (import_module(f"{__name__}.{name}").OBJECTIVE for name in RECORDS)
}
AUTO = "auto"

__all__ = ["AUTO", "OBJECTIVES", "ObjectiveSpec", "objective"]


def objective(name: str, key: str = "train.objective") -> ObjectiveSpec:
    """The spec of an objective by its name; a ConfigError naming ``key`` and the objectives there are."""
    if name not in OBJECTIVES:
        raise ConfigError(f"{key}={name!r} is not an objective; use {AUTO}, {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]
