"""Write ``planner/known_configs.json``: every preset as the installed transformers fills it in, its task and the
capability table's facts of its model (its task's spec measures what only the built model shows).

Run after editing presets.json or changing the pinned transformers: ``python -m bigtrain.tasks.record_presets``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from bigtrain.config.hf import model_config_object
from bigtrain.config.model_facts import ModelFacts
from bigtrain.planner.known_configs import FILE, transformers_version
from bigtrain.planner.model_stats import load_model_config, preset_names
from bigtrain.tasks import detect


def live_entry(preset: str) -> dict[str, Any]:
    """A preset's entry computed by transformers now (what the file records)."""
    config = load_model_config(preset, live=True)
    hf_config = model_config_object(config)
    task = detect(hf_config)
    extra = task.model_facts(hf_config) if task.model_facts is not None else {}
    return {"config": config, "task": task.name, "facts": asdict(ModelFacts.of(hf_config, **extra))}


def write(path: Path) -> None:
    """Record every preset's entry with the installed transformers."""
    import json

    presets = {name: live_entry(name) for name in preset_names()}
    data = {"transformers": transformers_version(), "presets": presets}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    target = Path(__file__).parents[1] / "planner" / FILE
    write(target)
    print(f"wrote {target} (transformers {transformers_version()})")
