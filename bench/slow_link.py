"""Measured against predicted step time of every_step / local_sgd / diloco / streaming DiLoCo over a throttled link.

Two replica groups of one CPU rank each (DDP, ``bigtrain train --nproc 2``) train the quickstart model, so every byte
that passes between the ranks is replica traffic. The link is throttled with a token bucket (``tc qdisc ... tbf``)
on the loopback of a network namespace of the run's own (``unshare -n``): the kernel here has no ``netem``, so the
link has a rate and no added delay (latency is left out of the predictions too). Both ranks' sends share the one
loopback queue: each direction gets half the rate, which is the rate the predictions use.

Predicted = the mode's own step measured without the throttle + the link's wait from the planner's terms
(``planner/replica_sync_time.py``, ``planner/cost.py``): for every_step the DDP all-reduce (gloo on CPU overlaps
nothing), for the others the outer all-reduce over H (streaming: what tau measured inner steps do not hide).
Measured = the mean step time of the throttled run (``elapsed_s`` in metrics.jsonl) over its last 3 periods of H = 8
steps (a synchronisation's wait falls on one step of H: a median would not see it).

    python bench/slow_link.py                   # writes bench/results/slow_link.md (about 3 minutes)
    python bench/slow_link.py --rate 50mbit     # another rate
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "slow_link.md"
STEPS, WARMUP, H = 32, 8, 8  # the mean over the last 3 periods of H steps
MODES = {
    "every_step": [],
    "local_sgd H=8": ["parallel.sync=local_sgd", f"parallel.sync_every={H}"],
    "diloco H=8": ["parallel.sync=diloco", f"parallel.sync_every={H}"],
    "streaming H=8 F=4 tau=1": [
        "parallel.sync=diloco",
        f"parallel.sync_every={H}",
        "parallel.fragments=4",
        "parallel.fragment_delay=1",
    ],
}
BASE = [
    f"train.steps={STEPS}",
    "train.global_batch_size=8",
    "data.seq_len=128",
    "parallel.backend=ddp",
    "parallel.zero_stage=0",
    "parallel.dp_replicate=2",
    "parallel.dp_shard=1",
    "parallel.micro_batch_size=4",
    "checkpoint.every=0",
    "checkpoint.save_final_model=false",
]


def run(mode: str, rate: str | None, out: Path) -> list[float]:
    """Step times (s) of one run, throttled to ``rate`` (tc's syntax, e.g. 100mbit) or not."""
    sets = [arg for item in BASE + MODES[mode] + [f"output_dir={out}"] for arg in ("--set", item)]
    recipe = str(REPO / "recipes" / "quickstart.yaml")
    train = [sys.executable, "-m", "bigtrain", "train", recipe, "--nproc", "2", *sets]
    if rate is None:
        subprocess.run(train, check=True, capture_output=True, cwd=REPO)
    else:
        # an MTU below the bucket's burst: a 64 KiB loopback packet would never fit a 64 KiB bucket and stall
        link = f"ip link set lo mtu 1500 && ip link set lo up && tc qdisc add dev lo root tbf rate {rate}"
        setup = f"{link} burst 64kb latency 1s"
        command = setup + " && exec " + " ".join(train)
        subprocess.run(["unshare", "-n", "sh", "-c", command], check=True, capture_output=True, cwd=REPO)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    elapsed = [r["elapsed_s"] for r in records]
    return [b - a for a, b in zip(elapsed, elapsed[1:], strict=False)][WARMUP:]


def predicted_wait(mode: str, step_s: float, bytes_per_s: float) -> float:
    """The planner's seconds per step spent waiting on a link of ``bytes_per_s`` each way (no latency)."""
    import yaml

    from bigtrain.config.capabilities.replica_sync import OPTIONS
    from bigtrain.config.resolve import parallel_of, resolve_plan
    from bigtrain.config.schema import TrainConfig
    from bigtrain.config.workload import Workload
    from bigtrain.planner.cost import estimate_time
    from bigtrain.planner.hardware import Cluster, ReplicaLink, lookup_gpu
    from bigtrain.planner.model_stats import ModelStats, load_model_config
    from bigtrain.planner.replica_sync_time import outer_wait_per_step

    recipe = yaml.safe_load((REPO / "recipes" / "quickstart.yaml").read_text())
    config = load_model_config(recipe["model"]["config"])
    stats = ModelStats.from_config(config)
    names = {o.name for o in OPTIONS}
    fixed = {k.removeprefix("parallel."): _value(v) for k, v in (s.split("=", 1) for s in BASE + MODES[mode])}
    parallel = {k: v for k, v in fixed.items() if k in {"backend", "zero_stage", "dp_replicate", "dp_shard",
                                                        "micro_batch_size"} | names}  # fmt: skip
    plan = resolve_plan(parallel_of(parallel), 2, TrainConfig(global_batch_size=8))
    # CPU ranks: gloo overlaps nothing; host copies of the outer state are memory copies (taken as free)
    cpu = replace(lookup_gpu("H100"), overlaps_comm=False, pcie_gbps=1e6)
    cluster = Cluster(cpu, 2, 1, replica_link=ReplicaLink(2, bytes_per_s, 0.0, "throttled loopback"))
    workload = Workload(seq_len=128, global_batch_size=8, mixed_precision="fp32")
    if mode == "every_step":
        return estimate_time(stats, plan, cluster, workload).link_wait_s
    return outer_wait_per_step(stats, plan, cluster, workload, step_s)


def _value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


def _rate_bytes(rate: str) -> float:
    units = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise SystemExit(f"--rate {rate}: write e.g. 100mbit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="100mbit", help="the throttled loopback's rate (tc syntax)")
    args = parser.parse_args()
    each_way = _rate_bytes(args.rate) / 2  # both ranks' sends share the loopback's one queue
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, mode in enumerate(MODES):
            free = statistics.mean(run(mode, None, Path(tmp) / f"free{i}"))
            slow = statistics.mean(run(mode, args.rate, Path(tmp) / f"slow{i}"))
            predicted = free + predicted_wait(mode, free, each_way)
            rows.append((mode, free, slow, predicted))
            print(f"{mode:26s} unthrottled {free:.3f} s  throttled {slow:.3f} s  predicted {predicted:.3f} s")
    lines = [
        f"# Step time over a throttled link ({args.rate} on a namespace's loopback, {args.rate} / 2 each way)",
        "",
        f"`python bench/slow_link.py --rate {args.rate}`: 2 replica groups of 1 CPU rank (DDP), the quickstart model",
        f"(0.83 M parameters), global batch 8 x 128 tokens, {STEPS} steps, means after {WARMUP}. Predicted: the",
        "unthrottled step of the same mode plus the planner's link wait (no latency term: the kernel has no netem).",
        "",
        "| mode | unthrottled s/step | throttled s/step | predicted s/step | predicted / measured |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {m} | {f:.3f} | {s:.3f} | {p:.3f} | {p / s:.2f} |" for m, f, s, p in rows]
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"written to {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
