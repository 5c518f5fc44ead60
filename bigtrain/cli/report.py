"""``bigtrain report OUTPUT_DIR``: a run's ``metrics.jsonl`` drawn as PNG plots, one per quantity, against the step.

- loss.png: training loss per step and, where the run evaluated, the held-out loss;
- rewards.png, reward_accuracy.png: a preference run's rewards of the chosen and rejected answers, their margin, and
  the share of pairs ranked right;
- lr.png: the learning rate the schedule applied;
- tokens_per_s.png (images_per_s.png, examples_per_s.png for a classifier): throughput of each step (the whole job's);
- accuracy.png (a classifier): held-out top-1 and top-5 accuracy and macro-F1 at each evaluation;
- memory.png: rank 0's peak memory after each step (CUDA allocator peak on GPU, process peak RSS on CPU).

A resumed run's file holds each step once (see train/metrics.py), so the curves are continuous across restarts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bigtrain.errors import ConfigError

# file name -> (title, y label, [(metrics key, legend label)], scale applied to the values); the plots of OPTIONAL are
# drawn only for runs that log their keys (a causal LM's tokens/s, a classifier's images/s and accuracy)
PLOTS: dict[str, tuple[str, str, list[tuple[str, str]], float]] = {
    "loss.png": ("Loss", "the objective (per token, example or pair)", [("loss", "train"), ("eval_loss", "eval")], 1.0),
    "lr.png": ("Learning rate", "lr", [("lr", "lr")], 1.0),
    "tokens_per_s.png": ("Throughput", "tokens / s", [("tokens_per_s", "tokens/s")], 1.0),
    "images_per_s.png": ("Throughput", "images / s", [("images_per_s", "images/s")], 1.0),
    "examples_per_s.png": ("Throughput", "examples / s", [("examples_per_s", "examples/s")], 1.0),
    "accuracy.png": (
        "Held-out accuracy",
        "fraction",
        [("eval_accuracy", "top-1"), ("eval_top5_accuracy", "top-5"), ("eval_macro_f1", "macro-F1")],
        1.0,
    ),
    # preference objectives (TRL's metric names): the implicit rewards of the chosen and rejected answers
    "rewards.png": (
        "Rewards",
        "reward (beta x log-ratio)",
        [("rewards/chosen", "chosen"), ("rewards/rejected", "rejected"), ("rewards/margins", "margin")],
        1.0,
    ),
    "reward_accuracy.png": (
        "Reward accuracy",
        "fraction of pairs ranked right",
        [("rewards/accuracies", "train"), ("eval_rewards/accuracies", "eval")],
        1.0,
    ),
    # titled by what was measured (records' peak_mem_measures): tensor memory on a GPU, the process's RSS on a CPU
    "memory.png": ("Peak memory (rank 0)", "GiB", [("peak_mem_bytes", "peak")], 1 / 2**30),
}
OPTIONAL = (
    "tokens_per_s.png",
    "images_per_s.png",
    "examples_per_s.png",
    "accuracy.png",
    "rewards.png",
    "reward_accuracy.png",
)


def read_run_metrics(output_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(output_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{output_dir!s} has no metrics.jsonl; give the output_dir of a bigtrain train run")
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash
    if not records:
        raise ConfigError(f"{path} holds no step yet; run at least one step first")
    return records


def series(records: list[dict[str, Any]], key: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
    """(steps, values) of one key, skipping steps without it (evaluations) and non-finite values (written as null)."""
    steps, values = [], []
    for r in records:
        value = r.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(int(r["step"]))
            values.append(float(value) * scale)
    return steps, values


def _memory_words(records: list[dict[str, Any]]) -> tuple[str, str]:
    """The memory plot's title and axis for what its numbers are."""
    measures = next((r["peak_mem_measures"] for r in reversed(records) if "peak_mem_measures" in r), None)
    if measures == "peak RSS":
        return "Peak RSS of the process (rank 0, CPU: Python and libraries included)", "GiB (RSS)"
    if measures is not None:
        return f"Peak tensor memory (rank 0, {measures})", "GiB"
    return "Peak memory (rank 0)", "GiB"


def write_report(output_dir: str | Path, out: str | Path | None = None) -> list[Path]:
    """Draw the plots into ``out`` (default OUTPUT_DIR/report); returns the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ConfigError("bigtrain report needs matplotlib: pip install matplotlib (or bigtrain[report])") from e
    records = read_run_metrics(output_dir)
    folder = Path(out) if out is not None else Path(output_dir) / "report"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (title, ylabel, keys, scale) in PLOTS.items():
        if name in OPTIONAL and not any(series(records, key)[0] for key, _ in keys):
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for key, label in keys:
            steps, values = series(records, key, scale)
            if steps:
                ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
        if name == "memory.png":
            title, ylabel = _memory_words(records)
            ax.set_ylim(bottom=0)  # from zero: a rise of a few MiB is not drawn as a cliff
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend()
        fig.tight_layout()
        fig.savefig(folder / name, dpi=100)
        plt.close(fig)
        written.append(folder / name)
    return written
