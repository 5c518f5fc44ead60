"""A capability is one file and one line: a toy capability (toy_capability.py: a recipe key, a row, a search variant,
a model transform, a memory term, an export note) copied into a copy of the package as
``config/capabilities/toy_buffer.py``, plus its name on one line of ``RECORDS``, is seen by ``bigtrain plan --all``,
start-up (``bigtrain train``), the simulator, ``bigtrain export`` and the generated docs, with nothing else edited."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, recipe_dict, save_rows, write_recipe

HERE = Path(__file__).parent
RECORD_LINE = '    "freeze",\n'  # the last record's line: the toy's goes after it


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """A copy of the repository's package and docs with the toy's one file and one line added."""
    root = tmp_path_factory.mktemp("toy")
    shutil.copytree(REPO / "bigtrain", root / "bigtrain", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copytree(REPO / "deepspeed_configs", root / "deepspeed_configs")
    shutil.copy(REPO / "README.md", root / "README.md")
    records = root / "bigtrain/config/capabilities"
    shutil.copy(HERE / "toy_capability.py", records / "toy_buffer.py")  # the one file
    init = (records / "__init__.py").read_text()
    assert init.count(RECORD_LINE) == 1
    (records / "__init__.py").write_text(init.replace(RECORD_LINE, RECORD_LINE + '    "toy_buffer",\n'))  # one line
    return root


def run(package: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(package)
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=package, env=env
    )
    return proc


def test_the_copy_imports_the_toy_and_the_repository_does_not(package):
    proc = run(package, "-c", "import bigtrain.config.capabilities as c; print(c.RECORDS[-1], c.__file__)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[0] == "toy_buffer" and proc.stdout.split()[1].startswith(str(package))
    from bigtrain.config.capabilities import RECORDS

    assert "toy_buffer" not in RECORDS


def test_every_consumer_sees_the_toy(package, tmp_path):
    rows = save_rows(tmp_path / "rows.npy", num_rows=32, seq_len=17)
    recipe = write_recipe(
        tmp_path / "toy.yaml",
        recipe_dict(tmp_path / "out", rows, train={"steps": 1, "global_batch_size": 4}, parallel={"micro_batch_size": 2}),
    )
    script = f"""
import json, sys, io, contextlib
from bigtrain.cli import main

def cli(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(args))
    return code, out.getvalue()

# the planner: the search weighs the toy (its variant), the table's row refuses it with pp, and the memory term counts
code, text = cli("plan", "{recipe}", "--gpus", "2", "--gpu-memory", "24GB", "--all", "--json")
assert code == 0, text
shown = json.loads(text)["candidates"]
toy = [c for c in shown if c["plan"]["toy_buffer_mib"] == 8]
plain = {{json.dumps({{**c["plan"], "toy_buffer_mib": 0}}, sort_keys=True): c for c in shown if c["plan"]["toy_buffer_mib"] == 0}}
twins = [(c, plain[json.dumps({{**c["plan"], "toy_buffer_mib": 0}}, sort_keys=True)]) for c in toy
         if json.dumps({{**c["plan"], "toy_buffer_mib": 0}}, sort_keys=True) in plain]
print("searched", len(toy), "twins", len(twins))
assert twins and all(t["memory"]["other_bytes"] - p["memory"]["other_bytes"] == 8 * 2**20 for t, p in twins)
code, text = cli("plan", "{recipe}", "--gpus", "2", "--gpu-memory", "24GB", "--all", "--fix", "pp=2", "--fix", "toy_buffer_mib=8")
print("pp=2 with the toy:", [line for line in text.splitlines() if "toy_buffer_mib=8 with parallel.pp=2" in line][:1])
assert "parallel.toy_buffer_mib=8 with parallel.pp=2 is not built" in text, text

# the simulator: the transform's buffer is in the measured peak
from bigtrain.config.load import load_recipe
from bigtrain.config.resolve import resolve_plan
from bigtrain.config.workload import Workload
from bigtrain.measure.simulate import simulate
cfg = load_recipe("{recipe}")
workload = Workload(seq_len=17, global_batch_size=4, mixed_precision="fp32")
peaks = {{}}
for mib in (0, 8):
    cfg.parallel.options = {{"toy_buffer_mib": mib}}
    plan = resolve_plan(cfg.parallel, 2, cfg.train)
    peaks[mib] = simulate(cfg.model.config, plan, workload)["Total"]
print("simulated peaks", peaks)
assert 8 * 2**20 <= peaks[8] - peaks[0] <= 8.5 * 2**20

# export: the toy's note
code, text = cli("export", "{recipe}", "--to", "deepspeed", "-o", "{tmp_path}/ds.json", "--gpus", "2",
                 "--set", "parallel.toy_buffer_mib=8", "--set", "parallel.backend=deepspeed")
assert code == 0, text  # its note is logged (checked below)

# the generated docs
sys.path.insert(0, "docs")
import generate
assert "`toy_buffer`" in generate.capability_list() and "`parallel.toy_buffer_mib`" in generate.key_table()
assert "| toy buffer: every device holds a scratch buffer for the run (`parallel.toy_buffer_mib`) | yes | yes | yes | yes |" in generate.capability_matrix()
assert "| `toy_buffer` |" in generate.transform_order()

# start-up: the recipe key is read, the transform runs, the row refuses pp with the toy before any rank starts
code, text = cli("train", "{recipe}", "--set", "parallel.toy_buffer_mib=8")
assert code == 0 and "toy_buffer: holding 8 MiB" in text, text
assert "toy_buffer_mib: 8" in open("{tmp_path}/out/recipe.yaml").read()
code, _ = cli("train", "{recipe}", "--dry-run", "--nproc", "2", "--set", "parallel.toy_buffer_mib=8", "--set", "parallel.pp=2")
assert code == 2
code, _ = cli("train", "{recipe}", "--dry-run", "--set", "parallel.toy_buffer_mb=8")
assert code == 2
print("ok")
"""
    proc = run(package, "-c", script, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
    assert "bigtrain: note: deepspeed holds no toy buffer; dropped" in proc.stderr

    assert "parallel.toy_buffer_mib=8 with parallel.pp=2 is not built; use pp=1" in proc.stderr  # said by the CLI
    assert "unknown recipe key parallel.toy_buffer_mb; did you mean parallel.toy_buffer_mib?" in proc.stderr
