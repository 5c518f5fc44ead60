"""Shared test helpers: tiny HF models saved locally, recipes on disk, running the real CLI in subprocesses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from cases import TINY_LLAMA

REPO = Path(__file__).resolve().parents[1]


def save_tiny_model(folder: Path, seed: int = 0, spec: dict[str, Any] | None = None, **overrides: Any) -> Path:
    """Create a tiny randomly initialised HF causal LM and save it with save_pretrained (safetensors).

    ``spec`` is a whole config (with model_type) for another family; ``overrides`` change fields of TINY_LLAMA.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from bigtrain.config.hf import hf_config_from_dict

    spec = spec if spec is not None else {**TINY_LLAMA, **overrides}
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config_from_dict(spec), dtype=torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def write_recipe(path: Path, recipe: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def run_cli(args: list[str], timeout: float = 240, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m bigtrain ARGS`` in a fresh process (the real CLI, launcher included)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    return subprocess.run(
        [sys.executable, "-m", "bigtrain", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or REPO,
        env=env,
    )


def read_metrics(output_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(
    args: list[str], nproc: int = 2, timeout: float = 180, module: bool = True
) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node N -m bigtrain ARGS`` (torch's launcher module, c10d rendezvous on loopback);
    with ``module=False``, ARGS start with a script to run instead of ``-m bigtrain``."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        *(["-m", "bigtrain"] if module else []),
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
