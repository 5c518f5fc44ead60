"""The README's plot: the planner's predictions against what was measured, from the recorded results (no training).

    pip install matplotlib        # only this script needs it (pip install -e '.[bench]')
    python bench/plot.py          # writes bench/results/predicted_vs_measured.png

Left, peak memory: every row of results/memory_matrix.md (planner vs bigtrain's step simulated on fake tensors) and
of results/rank0_h200.jsonl (today's planner vs ``torch.cuda.max_memory_allocated`` of rank 0 on an H200). Right, step
time: results/step_time_cpu.json (2 CPU gloo ranks, planner with the CPU probe profile) and the H200 rows without
offload or tp (compute only, planner with the H200 probe profile), both predicted by today's planner.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
sys.path.insert(0, str(BENCH))


def memory_points() -> dict[str, list[tuple[float, float]]]:
    """(measured GiB, predicted GiB) per source."""
    simulated, gpu = [], []
    for line in (RESULTS / "memory_matrix.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 13 and cells[-1].endswith("%") and cells[0] != "model":
            simulated.append((float(cells[11].replace(",", "")) / 1024, float(cells[10].replace(",", "")) / 1024))
    from rank0_on_device import CASES, predict

    by_name = {c.name: c for c in CASES}
    for record in h200_records():
        predicted = predict(by_name[record["case"]], record["plan"])["predicted_bytes"]
        gpu.append((record["peak_allocated_bytes"] / 2**30, predicted / 2**30))
    return {"fake-tensor step (CPU)": simulated, "rank 0 on an H200": gpu}


def h200_records() -> list[dict]:
    """The last recorded result of each H200 case (a case rerun after a fix appears twice in the file)."""
    last = {r["case"]: r for r in map(json.loads, (RESULTS / "rank0_h200.jsonl").read_text().splitlines())}
    return [r for r in last.values() if "error" not in r]


def time_points() -> dict[str, list[tuple[float, float]]]:
    """(measured s, predicted s) per source, predicted by today's planner with the probed profiles."""
    import step_time
    from rank0_on_device import CASES, predict

    cpu = [
        (measured, step_time.predict(name, str(RESULTS / "cpu_probe.json")))
        for name, measured in json.loads((RESULTS / "step_time_cpu.json").read_text()).items()
    ]
    by_name = {c.name: c for c in CASES}
    gpu = []
    for record in h200_records():
        plan = record["plan"]
        if plan["offload_params"] or plan["tp"] > 1:
            continue
        predicted = predict(by_name[record["case"]], plan, str(RESULTS / "h200_probe.json"))["predicted_compute_s"]
        gpu.append((record["step_s_median"], predicted))
    return {"2 CPU gloo ranks, whole step": cpu, "rank 0 on an H200, compute": gpu}


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, (title, unit, points) in zip(
        axes, [("Peak memory", "GiB", memory_points()), ("Step time", "s", time_points())], strict=True
    ):
        everything = [v for series in points.values() for pair in series for v in pair]
        lo, hi = min(everything) / 1.3, max(everything) * 1.3
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="predicted = measured")
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="grey", alpha=0.2, label="±10%")
        for (label, series), marker in zip(points.items(), ["o", "s"], strict=True):
            ax.scatter([m for m, _ in series], [p for _, p in series], marker=marker, label=f"{label} ({len(series)})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured ({unit})")
        ax.set_ylabel(f"planner's prediction ({unit})")
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("bigtrain planner: predicted vs measured (bench/results/, 2026-11-23)")
    fig.tight_layout()
    out = RESULTS / "predicted_vs_measured.png"
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
