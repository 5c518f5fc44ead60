"""Write ``planner/known_configs.json``: every preset as the installed transformers fills it in, its task, the
capability table's facts of its model (its task's spec measures what only the built model shows) and a classifier's
statistics at its default size.

Run after editing presets.json or changing the pinned transformers: ``python -m bigtrain.tasks.record_presets``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from bigtrain.config.hf import model_config_object
from bigtrain.config.model_facts import ModelFacts
from bigtrain.config.setup import DENOISED, EXAMPLES
from bigtrain.planner.known_configs import FILE, transformers_version
from bigtrain.planner.model_stats import load_model_config, preset_names
from bigtrain.tasks import detect


def live_entry(preset: str) -> dict[str, Any]:
    """A preset's entry computed by transformers now (what the file records)."""
    config = load_model_config(preset, live=True)
    hf_config = model_config_object(config)
    task = detect(hf_config)
    extra = task.model_facts(hf_config) if task.model_facts is not None else {}
    entry = {"config": config, "task": task.name, "facts": asdict(ModelFacts.of(hf_config, **extra))}
    if task.outputs in (EXAMPLES, DENOISED):  # a classifier, a diffusion transformer: statistics at the default size
        entry["classifier"] = classifier_stats(config, task)
    return entry


def classifier_stats(config: dict[str, Any], task: Any) -> dict[str, Any]:
    """The statistics ``bigtrain plan`` measures for a classifier preset at its default size (``TaskSpec.sizes``
    asked for nothing), in bf16 and fp32."""
    from bigtrain.planner.classifier_record import stats_key, stats_to_dict
    from bigtrain.planner.classifier_stats import measure_classifier
    from bigtrain.tasks.spec import PlanAsk

    sizes = task.sizes(PlanAsk(config, None, None, None, None, None, "full", 1, 1, _Flags()))
    side, length = sizes.get("image_size", 0), 0 if sizes.get("image_size") else sizes["seq_len"]
    if task.outputs == DENOISED:  # an image's tokens and its caption's
        length = sizes["seq_len"]
    out = {}
    for precision in ("bf16", "fp32"):
        stats = measure_classifier(config, side, length, precision, task.name, task.unit)
        out[stats_key(side, length, precision)] = stats_to_dict(stats)
    return out


class _Flags:
    """How ``bigtrain plan`` spells its arguments (a preset at its defaults gives none it could refuse)."""

    def __call__(self, name: str) -> str:
        return f"--{name.replace('_', '-')}"

    def value(self, name: str, value: Any) -> str:
        return f"{self(name)} {value}"


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
