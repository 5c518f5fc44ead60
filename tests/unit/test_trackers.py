"""train.log_to's trackers: each writes a run's numbers to its store on this machine, read back with the library's
own reader (TensorBoard's, MLflow's client, Trackio's storage; W&B's offline file through its protobuf records); a
missing package is named before anything starts; the HF Trainer route reports to the same tracker."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bigtrain.errors import ConfigError
from bigtrain.train import trackers
from bigtrain.train.metrics import MetricsWriter
from bigtrain.train.trackers import check_tracker, open_tracker

REPO = Path(__file__).resolve().parents[2]
RECIPE = {"train": {"lr": 0.01, "steps": 3}, "output_dir": "somewhere"}
RECORDS = [
    {"step": 1, "loss": 2.5, "grad_norm": 1.25, "lr": 0.005},
    {"step": 2, "loss": 2.0, "grad_norm": 1.0, "lr": 0.01, "eval_loss": 2.25},
    {"step": 3, "loss": 1.5, "grad_norm": None, "lr": 0.01},  # a null (diverged norm) is left out, not logged as 0
]
EXPECTED = {"train/loss": {1: 2.5, 2: 2.0, 3: 1.5}, "train/grad_norm": {1: 1.25, 2: 1.0}, "eval/loss": {2: 2.25}}


def log_run(out: Path, log_to: str) -> None:
    """What the training loop does on rank 0: a MetricsWriter with the tracker, one record per step."""
    writer = MetricsWriter(str(out), enabled=True, tracker=open_tracker(log_to, str(out), RECIPE, 0))
    for record in RECORDS:
        writer.log_step(record)
    writer.close()


def curves(points: list[tuple[str, int, float]]) -> dict[str, dict[int, float]]:
    found: dict[str, dict[int, float]] = {}
    for name, step, value in points:
        if name in EXPECTED:
            found.setdefault(name, {})[step] = value
    return found


def test_tensorboard_holds_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_run(tmp_path, "tensorboard")
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    points = [(tag, e.step, e.value) for tag in events.Tags()["scalars"] for e in events.Scalars(tag)]
    assert curves(points) == EXPECTED


@pytest.mark.full  # 4-7 s: MLflow creates its SQLite tables
def test_mlflow_holds_every_step_and_the_recipe(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    log_run(tmp_path, "mlflow")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("bigtrain").experiment_id])
    assert run.info.run_name == tmp_path.name and run.info.status == "FINISHED"
    assert run.data.params["train.lr"] == "0.01"  # the recipe, flattened
    points = [(k, m.step, m.value) for k in EXPECTED for m in client.get_metric_history(run.info.run_id, k)]
    assert curves(points) == EXPECTED


def wandb_records(run_file: str) -> list:
    """The protobuf records of a W&B offline run file: a header, then LevelDB-style chunks in 32 KiB blocks (each
    chunk: CRC32, length, type: 1 whole, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(run_file).read_bytes()
    assert data.startswith(b":W&B")
    block, pos, whole, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        whole = chunk if kind in (1, 2) else whole + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(whole)
            records.append(record)
    return records


def test_wandb_writes_an_offline_run_with_every_step(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # bigtrain's default: offline, no network, no login
    log_run(tmp_path, "wandb")
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "*.wandb"))
    records = wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.project == "bigtrain" and run.display_name == tmp_path.name
    assert {u.key: json.loads(u.value_json) for u in run.config.update}["train"] == RECIPE["train"]
    points = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            # a name with a slash may be stored split ("train", "loss") in nested_key
            values = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            points += [(k, r.history.step.num, v) for k, v in values.items()]
    assert curves(points) == EXPECTED


TRACKIO_READ = """
import json, sys
sys.path.insert(0, sys.argv[2])
from test_trackers import RECORDS, log_run
from pathlib import Path
log_run(Path(sys.argv[1]), "trackio")
from trackio.sqlite_storage import SQLiteStorage
print("LOGS", json.dumps(SQLiteStorage.get_logs("bigtrain", Path(sys.argv[1]).name)))
"""


@pytest.mark.full  # 3-4 s: a process of its own
def test_trackio_holds_every_step(tmp_path):
    # trackio reads its store's place (TRACKIO_DIR, its own variable) when imported: a process of its own
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "store")}
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", TRACKIO_READ, str(run), str(Path(__file__).parent)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("LOGS ")]
    logs = json.loads(line.removeprefix("LOGS "))
    points = [(k, log["step"], v) for log in logs for k, v in log.items()]
    assert curves(points) == EXPECTED
    assert (tmp_path / "store" / "bigtrain.db").is_file()


def test_a_missing_tracker_package_is_named_with_what_to_install(monkeypatch):
    monkeypatch.setitem(trackers.PACKAGES, "wandb", ("wandb_not_installed_here", "wandb"))
    with pytest.raises(ConfigError, match=r"train.log_to=wandb needs the wandb_not_installed_here package: pip install"):
        check_tracker("wandb")
    check_tracker("jsonl")  # metrics.jsonl alone needs nothing


@pytest.mark.parametrize("log_to", ["jsonl", "tensorboard", "wandb", "mlflow", "trackio"])
def test_the_hf_trainer_route_reports_to_the_same_tracker(log_to, tmp_path):
    import bigtrain

    result = bigtrain.recipe_plan(
        REPO / "recipes/quickstart.yaml", overrides=[f"train.log_to={log_to}"], gpus=2, gpu_memory="24GB"
    )
    export = result.export("hf-trainer")
    assert export.content["report_to"] == ("none" if log_to == "jsonl" else log_to)
    if log_to in ("wandb", "mlflow"):  # where bigtrain keeps the store, the Trainer needs the library's variable
        assert any(note.startswith(f"report_to={log_to}: bigtrain logs") for note in export.notes)
    args = result.to_training_arguments(output_dir=str(tmp_path), use_cpu=True)
    assert args.report_to == ([] if log_to == "jsonl" else [log_to])
