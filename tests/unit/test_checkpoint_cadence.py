"""checkpoint.every: auto: Young/Daly's interval sqrt(2 x save time x MTBF), in steps, from a measured save and step
time; the value is computed here from the formula, not from the code."""

from __future__ import annotations

import math
import re

import pytest
from helpers import read_metrics, recipe_dict, run_cli, save_rows, write_recipe

from bigtrain.checkpoint.cadence import job_mtbf_hours, young_daly_steps
from bigtrain.config.schema import CheckpointConfig


def test_the_interval_is_young_and_dalys_for_the_job_s_mtbf():
    # 8 GPUs at 50,000 h each fail every 6,250 h = 22.5e6 s; a 4 s save: sqrt(2 x 4 x 22.5e6) = 13,416.4 s
    mtbf_h = job_mtbf_hours(CheckpointConfig(every="auto"), gpus=8)
    assert mtbf_h == 6250.0
    assert young_daly_steps(4.0, 0.8, mtbf_h * 3600) == round(13416.407864998738 / 0.8) == 16771
    assert job_mtbf_hours(CheckpointConfig(every="auto", mtbf_hours=2.0), gpus=8) == 2.0  # given for the job
    assert young_daly_steps(0.01, 10.0, 1.0) == 1  # never below one step


def test_bad_cadence_values_are_one_line(tmp_path):
    from bigtrain.config.load import load_recipe
    from bigtrain.errors import ConfigError

    path = write_recipe(tmp_path / "r.yaml", recipe_dict(tmp_path / "out", save_rows(tmp_path / "rows.npy")))
    with pytest.raises(ConfigError, match=r"checkpoint.every='often' is not allowed; use one of: auto"):
        load_recipe(str(path), ["checkpoint.every=often"])
    with pytest.raises(ConfigError, match=r"checkpoint.mtbf_hours=0.0 must be at least 0.001"):
        load_recipe(str(path), ["checkpoint.every=auto", "checkpoint.mtbf_hours=0"])


def test_mtbf_on_the_command_line_is_the_recipe_key_checked_as_one(tmp_path, capfd):
    from bigtrain.cli import main

    path = write_recipe(tmp_path / "r.yaml", recipe_dict(tmp_path / "out", save_rows(tmp_path / "rows.npy")))
    assert main(["train", str(path), "--set", "checkpoint.every=auto", "--mtbf", "0", "--dry-run"]) == 2
    assert "checkpoint.mtbf_hours=0.0 must be at least 0.001" in capfd.readouterr().err


@pytest.mark.full
def test_auto_measures_a_first_save_then_saves_at_the_formula_s_interval(tmp_path):
    """One process, a job MTBF of 36 s (``--mtbf 0.01``): the first checkpoint (step 10) measures the save; the interval that
    follows is sqrt(2 x save x 36 s) over the step time, from the numbers the line says."""
    recipe = recipe_dict(
        tmp_path / "out",
        save_rows(tmp_path / "rows.npy", num_rows=64),
        train={"steps": 60, "global_batch_size": 4},
        checkpoint={"every": "auto", "keep": 100, "save_final_model": False},
    )
    proc = run_cli(["train", str(write_recipe(tmp_path / "r.yaml", recipe)), "--mtbf", "0.01"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if "checkpoint.every auto:" in x)
    every, save_s, step_s = re.search(
        r"every (\d+) steps: a save takes ([\d.e+-]+) s and a step ([\d.e+-]+) s", line
    ).groups()
    every, save_s, step_s = int(every), float(save_s), float(step_s)
    expected = math.sqrt(2 * save_s * 0.01 * 3600) / step_s
    # the line's numbers have three significant figures (within 1% of the interval); the steps are whole
    assert abs(every - expected) <= max(1.0, 0.02 * expected), (every, expected, line)
    saved = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "out" / "checkpoints").iterdir())
    assert saved == sorted({10, *range(every, 61, every), 60}), (saved, every)
    assert [m["step"] for m in read_metrics(tmp_path / "out")] == list(range(1, 61))
