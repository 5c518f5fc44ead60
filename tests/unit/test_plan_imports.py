"""``bigtrain plan`` imports what planning needs only: not DeepSpeed, peft, torchao or TRL (seconds of imports for a
command that should answer in about three)."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO

HEAVY = ("deepspeed", "peft", "torchao", "trl")


def test_planning_imports_no_training_library():
    script = (
        "import io, contextlib, sys\n"
        "from bigtrain.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['plan', '--model', 'llama-3-8b', '--gpus', '8', '--gpu', 'H100'])\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
