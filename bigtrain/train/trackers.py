"""Experiment trackers beside metrics.jsonl (``train.log_to``): TensorBoard, Weights & Biases, MLflow, Trackio.

Each is the library's own client writing to a store on this machine, opened on rank 0 only, so a run needs no
network and no account: TensorBoard event files in ``output_dir/tensorboard``; a W&B offline run in
``output_dir/wandb`` (``wandb sync`` uploads it; wandb's own ``WANDB_MODE`` chooses another mode); an MLflow SQLite
store ``output_dir/mlflow.db`` (``MLFLOW_TRACKING_URI``, MLflow's own variable, names another store; ``mlflow ui``
shows it, given the store); Trackio's local database (``trackio show``). Every tracker gets the same
names as TensorBoard's tags (``train/loss``, ``eval/loss``), the optimizer step as its step, the recipe as its
config, the project ``bigtrain`` and the output folder's name as the run's name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import time
from pathlib import Path
from typing import Any, Protocol

from bigtrain.checkpoint.run_dir import MLFLOW_DB, TENSORBOARD_DIR, flat_recipe
from bigtrain.errors import ConfigError

PROJECT = "bigtrain"

log = logging.getLogger(__name__)

# train.log_to value -> (the module it imports, what to install)
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny sqlalchemy alembic"),
    "trackio": ("trackio", "trackio"),
}


class Tracker(Protocol):
    def log(self, values: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def tag(key: str) -> str:
    """metrics.jsonl key -> tracker name: held-out numbers under eval/, the rest under train/."""
    return f"eval/{key.removeprefix('eval_')}" if key.startswith("eval_") else f"train/{key}"


def check_tracker(log_to: str) -> None:
    """The tracker's package is installed: found before any process group starts, on every rank."""
    if log_to not in PACKAGES:
        return
    module, install = PACKAGES[log_to]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"train.log_to={log_to} needs the {module} package: pip install {install} (or bigtrain[{log_to}]); "
            "train.log_to=jsonl writes metrics.jsonl alone"
        )


def open_tracker(log_to: str, output_dir: str, config: dict[str, Any], resumed_at: int) -> Tracker | None:
    """The tracker ``train.log_to`` names, opened for this start of the run (None for jsonl alone).

    ``resumed_at``: the step a resumed start continues from (0 for a new run); TensorBoard drops what an earlier
    start logged after it, the others log this start as a run of its own that carries on from that step.
    """
    if log_to == "jsonl":
        return None
    out = Path(output_dir)
    name = out.resolve().name
    if log_to == "tensorboard":
        return _TensorBoard(out / TENSORBOARD_DIR, resumed_at)
    if log_to == "wandb":
        return _Wandb(out, name, config)  # wandb writes its runs in a wandb/ folder (WANDB_DIR) of the dir given
    if log_to == "mlflow":
        return _MLflow(out / MLFLOW_DB, name, config)
    if log_to == "trackio":
        return _Trackio(name, config)
    raise ValueError(f"unknown tracker {log_to!r}")  # the schema admits only the names above


def numbers(record: dict[str, Any]) -> dict[str, float]:
    """A metrics record's numbers under tracker names (the step, flags and nulls left out)."""
    return {
        tag(key): float(value)
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class _TensorBoard:
    def __init__(self, folder: Path, resumed_at: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run's event file drops what an earlier start logged after its checkpoint
        self._writer = SummaryWriter(str(folder), purge_step=resumed_at + 1 if resumed_at else None)

    def log(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class _Wandb:
    def __init__(self, out: Path, name: str, config: dict[str, Any]) -> None:
        import wandb

        self._wandb = wandb
        # offline unless wandb's own WANDB_MODE says otherwise: no network, no login prompt in a job
        mode = None if os.environ.get("WANDB_MODE") else "offline"
        out.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=PROJECT,
            name=name,
            dir=str(out),
            config=config,
            mode=mode,
            reinit="create_new",
            settings=wandb.Settings(silent=True),  # its banner and run summary: our one line says where the run is
        )
        folder = Path(self._run.dir).parent  # the run's files/ folder is inside the folder wandb sync takes
        where = f"offline in {folder} (wandb sync uploads it)" if self._run.offline else self._run.url
        log.info("wandb: run %s, %s", name, where)

    def log(self, values: dict[str, float], step: int) -> None:
        self._run.log(values, step=step)

    def close(self) -> None:
        self._run.finish()
        # finish() can return before wandb's service process has written the run file; teardown waits for it
        self._wandb.teardown()


class _MLflow:
    def __init__(self, db: Path, name: str, config: dict[str, Any]) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param

        self._metric = Metric
        # a client of its own, not mlflow's process-wide active run: the store is this run's folder unless
        # MLflow's own MLFLOW_TRACKING_URI names another
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{db.resolve()}"
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(PROJECT)
        experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(PROJECT)
        self._run_id = self._client.create_run(experiment_id, run_name=name).info.run_id
        params = [Param(key, str(value)[:6000]) for key, value in flat_recipe(config).items()]
        for first in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            self._client.log_batch(self._run_id, params=params[first : first + 100])
        log.info("mlflow: run %s in experiment %s of %s", name, PROJECT, uri)

    def log(self, values: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)  # MLflow's timestamps are in milliseconds
        self._client.log_batch(self._run_id, metrics=[self._metric(k, v, now, step) for k, v in values.items()])

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


class _Trackio:
    def __init__(self, name: str, config: dict[str, Any]) -> None:
        import trackio

        self._trackio = trackio
        with contextlib.redirect_stdout(io.StringIO()):  # trackio prints a banner; our one line says where
            self._run = trackio.init(project=PROJECT, name=name, config=config, resume="never", auto_log_cpu=False)
        log.info("trackio: run %s in project %s (trackio show --project %s)", name, PROJECT, PROJECT)

    def log(self, values: dict[str, float], step: int) -> None:
        self._run.log(values, step=step)

    def close(self) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            self._trackio.finish()  # the module's finish: its exit hook then has no run left to finish again

