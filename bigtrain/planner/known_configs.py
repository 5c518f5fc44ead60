"""What transformers makes of each preset, recorded, so that planning a preset imports no transformers.

Importing transformers and a family's configuration module costs about 2 s on the 2-core CI machine, more than the
rest of ``bigtrain plan``. For every preset, ``known_configs.json`` records the full config dict (transformers'
defaults filled in, checked as ``load_model_config`` checks it), its task and the capability table's facts
(``ModelFacts``), and for a classifier its statistics at its default size (``ClassifierStats``, measured on fake
tensors),
with the transformers version they came from. They are read only while that version is installed (otherwise
transformers is asked, as for any other model): a recorded value is what the live call would return, never a
guess. ``python -m bigtrain.tasks.record_presets`` writes the file; tests/unit/test_known_configs.py recomputes
every entry and fails when one differs, or when the installed transformers is not the recorded one.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import metadata, resources
from typing import Any

from bigtrain.config.model_facts import ModelFacts

FILE = "known_configs.json"


def transformers_version() -> str:
    """The installed transformers' version, read from its metadata (nothing imported)."""
    return metadata.version("transformers")


@cache
def _recorded() -> dict[str, Any]:
    path = resources.files("bigtrain.planner").joinpath(FILE)
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data["presets"] if data.get("transformers") == transformers_version() else {}


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


@cache
def _by_config() -> dict[str, dict[str, Any]]:
    return {_key(entry["config"]): entry for entry in _recorded().values()}


def recorded_config(preset: str) -> dict[str, Any] | None:
    """A preset's full config dict as transformers fills it in, or None when not recorded for this transformers."""
    entry = _recorded().get(preset)
    return json.loads(json.dumps(entry["config"])) if entry else None  # a copy the caller may change


def recorded_facts(config: dict[str, Any]) -> ModelFacts | None:
    """The facts of a full config dict that is a recorded preset's, or None (then ask transformers)."""
    entry = _by_config().get(_key(config))
    if entry is None:
        return None
    facts = entry["facts"]
    return ModelFacts(**{**facts, "tp_styles": tuple(facts["tp_styles"])})


def recorded_classifier(config: dict[str, Any], image_size: int, seq_len: int, mixed_precision: str) -> Any:
    """A classifier preset's statistics measured at this size and precision, as recorded (``ClassifierStats``), or
    None (then measure them)."""
    from bigtrain.planner.classifier_record import stats_from_dict, stats_key

    entry = _by_config().get(_key(config))
    found = (entry or {}).get("classifier", {}).get(stats_key(image_size, seq_len, mixed_precision))
    return None if found is None else stats_from_dict(found)


def recorded_task(config: dict[str, Any]) -> str | None:
    """The task (``model.task``) of a full config dict that is a recorded preset's, or None (then ask transformers)."""
    entry = _by_config().get(_key(config))
    return None if entry is None else entry["task"]
