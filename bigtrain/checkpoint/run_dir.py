"""What a start does with its ``output_dir``: begin at step 0, resume, or refuse, so runs are never mixed.

Decided from the files alone, before the process group exists, identically on every rank. The run's recipe is
kept in ``output_dir/recipe.yaml`` and in every checkpoint; a start that differs from it in anything but the keys
a resume may change (the step count, the plan, checkpointing, timeouts) is a different run and is refused, unless
``checkpoint.resume=false`` asks for a new run, in which case the earlier outputs are moved aside, not deleted.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bigtrain.checkpoint.layout import (
    CHECKPOINTS,
    RECIPE,
    Manifest,
    check_files,
    checkpoints_dir,
    complete_checkpoints,
    remove_stale,
    resolve_checkpoint,
)
from bigtrain.config.load import dump_recipe, recipe_to_dict
from bigtrain.config.schema import ADAPTER_METHODS, RecipeConfig
from bigtrain.errors import ConfigError, RunFinished

# Recipe keys a resumed run may change: they do not change what the model has learnt so far. The model and data
# paths may move (another machine); the loader checks the model's names and shapes against the checkpoint, and
# the run warns when the data's rows differ.
MAY_CHANGE_ON_RESUME = (
    "train.steps",
    "train.collective_timeout_s",
    "parallel.",
    "checkpoint.",
    "output_dir",
    "model.name_or_path",
    "data.path",
    "data.eval_path",  # what is evaluated and logged does not change what is trained
    "train.eval_every",
    "train.log_to",
)
FINAL_MODEL = "model"
FINAL_ADAPTER = "adapter"  # an adapter run's output: peft's folder
# what train.log_to's trackers write in output_dir (train/trackers.py)
TENSORBOARD_DIR, WANDB_DIR, MLFLOW_DB = "tensorboard", "wandb", "mlflow.db"
RUN_OUTPUTS = (
    *("metrics.jsonl", "plan.json", RECIPE, CHECKPOINTS, FINAL_MODEL, FINAL_ADAPTER),
    *(TENSORBOARD_DIR, WANDB_DIR, MLFLOW_DB, "report"),
)


@dataclass(frozen=True)
class Start:
    resume_from: Path | None  # the checkpoint to load, or None for step 0
    metrics_through: int  # metrics.jsonl keeps its records up to this step (0: a new file)
    set_aside: bool  # move an earlier run's outputs to output_dir/replaced-<time>/ first
    note: str  # what the log says about it ("" when there is nothing to say)


def plan_start(cfg: RecipeConfig) -> Start:
    """What this start does with ``output_dir``; RunFinished when its run has already reached ``train.steps`` (job
    schedulers re-queue and torchrun restarts on a non-zero exit: a finished run started again must exit 0)."""
    out = Path(cfg.output_dir)
    earlier = [name for name in RUN_OUTPUTS if (out / name).exists()]
    resume = cfg.checkpoint.resume
    if resume is False:
        note = f"checkpoint.resume=false: a new run; the earlier outputs move to {out}/replaced-<time>/"
        return Start(None, 0, bool(earlier), note if earlier else "")
    if (out / RECIPE).is_file():
        _require_same_run(_read_recipe(out / RECIPE), cfg, f"output_dir {out}")
    elif earlier:
        raise ConfigError(
            f"output_dir {out} holds outputs ({', '.join(earlier)}) of a run without its recipe.yaml; "
            "use another output_dir, or --set checkpoint.resume=false to move them aside and start over"
        )
    skipped: list[str] = []
    if resume == "auto":
        folder, skipped = newest_good_checkpoint(checkpoints_dir(out))
    else:
        folder = resolve_checkpoint(resume)
        check_files(folder, Manifest.read(folder))  # a checkpoint named by the recipe is used whole or refused
    if folder is None and skipped:  # starting over would silently throw the run away
        raise ConfigError(
            f"every checkpoint of {checkpoints_dir(out)} is damaged ({' '.join(skipped)}); restore one, or --set "
            "checkpoint.resume=false to start over"
        )
    if folder is None:
        # nothing to resume: a fresh start, but the earlier start's metrics are kept, not overwritten
        note = (
            f"{out} holds an earlier start of this run but no complete checkpoint: starting again at step 0; its "
            f"outputs move to {out}/replaced-<time>/"
        )
        return Start(None, 0, bool(earlier), note if earlier else "")
    _require_same_run(_read_recipe(folder / RECIPE), cfg, f"checkpoint {folder}")
    step = Manifest.read(folder).step
    if step >= cfg.train.steps:
        model = out / (FINAL_ADAPTER if cfg.train.method in ADAPTER_METHODS else FINAL_MODEL)
        where = f"its output is in {model}" if model.is_dir() else f"export it with: bigtrain export-model {folder}"
        raise RunFinished(
            f"the run is finished: {folder} is at step {step} and train.steps={cfg.train.steps}; {where}. Raise "
            "train.steps to train on, or --set checkpoint.resume=false to start over"
        )
    resuming = f"resuming from {folder} (step {step} of {cfg.train.steps})"
    return Start(folder, step, False, " ".join([*skipped, resuming]))


def newest_good_checkpoint(root: Path) -> tuple[Path | None, list[str]]:
    """The newest complete checkpoint whose files are whole (sizes and checksums), and a line for each newer one
    that is damaged: a crash cannot leave one (saves publish whole), but a disk or a person can."""
    skipped = []
    for _, folder in reversed(complete_checkpoints(root)):
        try:
            check_files(folder, Manifest.read(folder))
        except ConfigError as e:
            skipped.append(f"{e}: skipped.")
            continue
        return folder, skipped
    return None, skipped


def prepare_output_dir(start: Start, cfg: RecipeConfig) -> None:
    """Rank 0, once: move an earlier run aside if asked, clear interrupted saves, record this run's recipe."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if start.set_aside:
        stamp = time.strftime("replaced-%Y%m%d-%H%M%S")
        aside, n = out / stamp, 1
        while aside.exists():  # two starts within a second
            aside, n = out / f"{stamp}-{n}", n + 1
        aside.mkdir()
        for name in RUN_OUTPUTS:
            if (out / name).exists():
                os.rename(out / name, aside / name)
    remove_stale(checkpoints_dir(out))
    (out / RECIPE).write_text(dump_recipe(cfg))


def _read_recipe(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path} cannot be read ({e})") from e
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} is not a recipe")
    return loaded


def flat_recipe(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A recipe as ``{"train.lr": 0.01, ...}``; model.config stays one value (the model's own config)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key != "config":
            flat.update(flat_recipe(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# (key, saved, now) that mean the same run: a default written out before it became "unset"
# (train.weighting_scheme: none was every run's until SD3's logit_normal made the default the family's; no SD3 run
# was trained before)
SAME_VALUES = {("train.weighting_scheme", "none", None)}


def recipe_differences(saved: dict[str, Any], cfg: RecipeConfig) -> list[str]:
    """``key: saved -> now`` for every recipe key that differs and that a resume may not change."""
    # a key the saved recipe lacks (written before the key existed) had its default
    old = {**flat_recipe(recipe_to_dict(RecipeConfig())), **flat_recipe(saved)}
    new = flat_recipe(recipe_to_dict(cfg))
    out = []
    for key in sorted(set(old) | set(new)):
        if key.startswith(MAY_CHANGE_ON_RESUME) or old.get(key) == new.get(key):
            continue
        # auto resumes with the saved run's method, compile and FP8 choices
        if key in ("train.method", "train.compile", "train.fp8") and new.get(key) == "auto":
            continue
        if (key, old.get(key), new.get(key)) in SAME_VALUES:
            continue
        out.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return out


def _require_same_run(saved: dict[str, Any], cfg: RecipeConfig, where: str) -> None:
    differences = recipe_differences(saved, cfg)
    if differences:
        shown = "; ".join(differences[:3]) + (f" (and {len(differences) - 3} more)" if len(differences) > 3 else "")
        raise ConfigError(
            f"{where} holds a run with another recipe ({shown}); use another output_dir, or "
            "--set checkpoint.resume=false to start a new run there (the earlier outputs are moved aside)"
        )
