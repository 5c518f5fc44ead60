"""The README's "fine-tune a local HF model and get it back" commands, run as written (in a scratch folder holding a
link to ``recipes/``), each of which must succeed; then their results are checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import REPO

BLOCK = re.compile(r"<!-- walkthrough:begin -->\s*```bash\n(.*?)```\s*<!-- walkthrough:end -->", re.S)


def walkthrough_commands() -> list[str]:
    (block,) = BLOCK.findall((REPO / "README.md").read_text())
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_walkthrough_runs_as_written(tmp_path):
    from safetensors.torch import load_file

    commands = walkthrough_commands()
    assert len(commands) == 5
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    # `python` and `bigtrain` are this interpreter's (the installed console script lives next to it)
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    outputs = []
    for command in commands:
        proc = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{command}\n{proc.stderr[-3000:]}"
        outputs.append(proc)

    run = tmp_path / "demo" / "run"
    assert outputs[2].stdout.startswith("LlamaForCausalLM ")  # step 3 loaded the trained model
    assert "resuming from demo/run/checkpoints/step_20 (step 20 of 30)" in outputs[3].stderr
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 31))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_20", "step_30"]  # keep: 2
    exported = load_file(str(tmp_path / "demo" / "step_20" / "model.safetensors"))
    final = load_file(str(run / "model" / "model.safetensors"))
    assert set(exported) == set(final)
    assert any(not (exported[k] == final[k]).all() for k in final)  # step 20 and step 30 are different models
