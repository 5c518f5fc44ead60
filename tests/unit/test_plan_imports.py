"""``bigtrain plan`` imports what planning needs only (seconds of imports for a command that should answer within
three): for a preset not even torch or transformers (its config as transformers fills it in is recorded,
``planner/known_configs.py``), and never DeepSpeed, peft, torchao or TRL."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO

HEAVY = ("deepspeed", "peft", "torchao", "trl")
FOR_A_PRESET = (*HEAVY, "torch", "transformers")


def _imported(args: list[str], names: tuple[str, ...]) -> list[str]:
    script = (
        "import io, contextlib, sys\n"
        "from bigtrain.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main({args!r})\n"
        f"print(sorted(m for m in {names!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return eval(proc.stdout.strip().splitlines()[-1])


def test_planning_a_preset_imports_neither_torch_nor_transformers():
    assert _imported(["plan", "--model", "llama-3-405b", "--gpus", "1024", "--gpu", "H100"], FOR_A_PRESET) == []


def test_planning_a_model_folder_imports_no_training_library(tmp_path):
    # a config.json transformers must fill in (no recorded preset): transformers and torch, but nothing else heavy
    (tmp_path / "config.json").write_text(
        '{"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}'
    )
    assert _imported(["plan", "--model", str(tmp_path), "--gpus", "2", "--gpu", "H100"], HEAVY) == []


def test_training_with_a_written_plan_never_imports_the_search():
    """Start-up with a written plan predicts its plan (memory terms) and names it, but searches nothing: the
    planner's search, its table and the Python API stay unimported (``plan: auto`` imports them where it plans)."""
    search = ("bigtrain.planner.search", "bigtrain.planner.explain", "bigtrain.api.planning")
    args = ["train", str(REPO / "recipes" / "quickstart.yaml"), "--dry-run"]
    assert _imported(args, search) == []


def test_planning_a_classifier_preset_imports_neither_torch_nor_transformers():
    """A classifier's preset plans from its recorded statistics as an LM's does (no fake-tensor measurement)."""
    assert _imported(["plan", "--model", "resnet-50", "--gpus", "8", "--gpu", "A100-80GB"], FOR_A_PRESET) == []
