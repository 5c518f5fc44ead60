"""Checkpoint folders on disk (completeness, publish, pruning), the start decision for an output_dir, the recipe's
``checkpoint`` section and the metrics file of a resumed run: pure file logic, no process group."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from bigtrain.checkpoint.layout import (
    Manifest,
    check_files,
    complete_checkpoints,
    list_files,
    partial_dir,
    prune,
    publish,
    remove_stale,
    resolve_checkpoint,
    step_dir,
)
from bigtrain.checkpoint.run_dir import plan_start, prepare_output_dir, recipe_differences
from bigtrain.config.load import load_recipe, recipe_to_dict
from bigtrain.errors import ConfigError, RunFinished
from bigtrain.train.metrics import MetricsWriter


def fake_checkpoint(root, step: int, complete: bool = True):
    """A folder shaped like a checkpoint (DCP metadata, one shard, a manifest when complete)."""
    folder = partial_dir(root, step)
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"m")
    (folder / "__0_0.distcp").write_bytes(b"x" * 10)
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe_to_dict(load_recipe(None))))
    if not complete:
        return folder
    Manifest(step, 0, 0, 1, {}, {}, list_files(folder), "t").write(folder)
    publish(folder, step_dir(root, step))
    return step_dir(root, step)


def test_only_published_checkpoints_count_and_pruning_keeps_the_newest(tmp_path):
    for step in (2, 4, 10):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 12, complete=False)  # a save interrupted before its publish
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2, 4, 10]  # by number, not by name
    assert resolve_checkpoint(tmp_path) == step_dir(tmp_path, 10)
    prune(tmp_path, keep=2)
    remove_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_10", "step_4"]


def test_publishing_a_step_again_replaces_it_whole(tmp_path):
    fake_checkpoint(tmp_path, 2)
    partial = partial_dir(tmp_path, 2)
    partial.mkdir()
    (partial / "new").write_text("new")
    publish(partial, step_dir(tmp_path, 2))
    assert sorted(p.name for p in step_dir(tmp_path, 2).iterdir()) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2"]


def test_file_sizes_recorded_at_save_catch_missing_and_truncated_files(tmp_path):
    folder = fake_checkpoint(tmp_path, 1)
    manifest = Manifest.read(folder)
    check_files(folder, manifest)
    (folder / "__0_0.distcp").write_bytes(b"x" * 4)
    with pytest.raises(ConfigError, match=r"__0_0.distcp has 4 bytes, 10 were written"):
        check_files(folder, manifest)
    (folder / "__0_0.distcp").unlink()
    with pytest.raises(ConfigError, match=r"__0_0.distcp is missing"):
        check_files(folder, manifest)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nope")


def recipe_in(out, *overrides: str):
    return load_recipe(None, [f"output_dir={out}", "train.steps=4", *overrides])


def test_start_decisions(tmp_path):
    out = tmp_path / "run"
    assert plan_start(recipe_in(out)).resume_from is None  # nothing there: step 0
    cfg = recipe_in(out)
    prepare_output_dir(plan_start(cfg), cfg)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    again = plan_start(recipe_in(out, "parallel.backend=ddp"))  # a plan change is still the same run
    assert again.resume_from is None and "no complete checkpoint" in again.note
    fake_checkpoint(out / "checkpoints", 2)
    resumed = plan_start(recipe_in(out, "train.steps=6"))
    assert (resumed.resume_from, resumed.metrics_through) == (out / "checkpoints" / "step_2", 2)
    with pytest.raises(ConfigError, match=r"another recipe \(train.lr: 0.0003 -> 0.1\)"):
        plan_start(recipe_in(out, "train.lr=0.1"))
    fake_checkpoint(out / "checkpoints", 4)
    with pytest.raises(RunFinished, match="the run is finished: .*step_4 is at step 4 and train.steps=4"):
        plan_start(recipe_in(out))
    fresh = plan_start(recipe_in(out, "train.lr=0.1", "checkpoint.resume=false"))
    assert fresh.set_aside and fresh.resume_from is None


def test_outputs_without_a_recipe_are_not_mixed_with(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ConfigError, match=r"holds outputs \(metrics.jsonl\) of a run without its recipe.yaml"):
        plan_start(recipe_in(tmp_path))


def test_the_keys_a_resume_may_change():
    saved = recipe_to_dict(load_recipe(None))
    changed = load_recipe(None, ["train.steps=7", "parallel.backend=ddp", "checkpoint.every=3", "data.path=x.npy"])
    assert recipe_differences(saved, changed) == []
    assert recipe_differences(saved, load_recipe(None, ["train.seed=1"])) == ["train.seed: 0 -> 1"]


def test_the_checkpoint_section_reads_and_writes_its_yaml_names(tmp_path):
    cfg = load_recipe(None, ["checkpoint.async=true", "checkpoint.resume=true"])
    assert cfg.checkpoint.async_save and cfg.checkpoint.resume == "auto"
    assert recipe_to_dict(cfg)["checkpoint"]["async"] is True
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe_to_dict(cfg)))
    assert load_recipe(tmp_path / "r.yaml") == cfg  # a saved recipe loads back as itself
    with pytest.raises(ConfigError, match="checkpoint.keep=0 must be at least 1"):
        load_recipe(None, ["checkpoint.keep=0"])
    with pytest.raises(ConfigError, match="unknown recipe key checkpoint.async_save"):
        load_recipe(None, ["checkpoint.async_save=true"])


def test_a_resumed_run_keeps_metrics_up_to_its_checkpoint(tmp_path):
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in (1, 2, 3)] + ['{"step": 4, "lo']  # cut by a crash
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    writer = MetricsWriter(str(tmp_path), enabled=True, keep_through_step=2)
    writer.log_step({"step": 3, "loss": 0.5})
    writer.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    MetricsWriter(str(tmp_path), enabled=True).close()  # a new run starts a new file
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_published_files_are_readable_as_the_umask_says(tmp_path):
    from bigtrain.checkpoint.layout import publish

    partial = tmp_path / ".step_1.partial"
    (partial / "hf").mkdir(parents=True)
    for name in ("model.safetensors", "hf/config.json"):
        (partial / name).write_bytes(b"x")
        (partial / name).chmod(0o600)  # as safetensors writes its files
    old = os.umask(0o027)
    try:
        publish(partial, tmp_path / "step_1")
    finally:
        os.umask(old)
    for name in ("model.safetensors", "hf/config.json"):
        assert (tmp_path / "step_1" / name).stat().st_mode & 0o777 == 0o640


def test_rank_0_waits_for_a_silent_rank_s_checksums_only_the_collective_timeout_and_says_it_did_not_answer(tmp_path):
    """A rank stopped between its shard and its checksum file: rank 0 gives up after train.collective_timeout_s, as a
    collective would (not 600 s), with an error the command line reads as a rank that stopped answering (exit 7)."""
    import time

    from bigtrain.checkpoint.layout import CHECKSUMS, gather_checksums
    from bigtrain.errors import no_answer, peer_failure

    (tmp_path / CHECKSUMS).mkdir()
    (tmp_path / CHECKSUMS / "rank_0.json").write_text("{}")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="Timed out waiting 1 s for the shard checksums of rank_1.json") as caught:
        gather_checksums(tmp_path, 2, timeout_s=1)
    assert time.monotonic() - started < 5
    assert peer_failure(caught.value) is caught.value and no_answer(caught.value)
