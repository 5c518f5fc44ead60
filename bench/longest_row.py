"""The longest row the planner fits for Llama-3-8B on one GPU, full fine-tuning and LoRA, with and without activation
offload: ``python bench/longest_row.py [--gpu H100] [--host-memory 256GB]``. Prints one line per case with the plan
and its predicted peak and step time (rows in steps of 8,192 tokens, one row per step). Predictions only: the same
numbers ``bigtrain plan`` gives; no GPU run is behind them."""

from __future__ import annotations

import argparse
import sys

from bigtrain.config.workload import Workload
from bigtrain.planner.explain import describe
from bigtrain.planner.hardware import GiB, make_cluster
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.planner.search import search

STEP = 8192


def best_fitting(stats: ModelStats, cluster, seq_len: int, method: str, offload: bool):
    workload = Workload(seq_len=seq_len, global_batch_size=1, method=method)
    fixed = None if offload else {"offload_activations": False}
    found = search(stats, cluster, workload, fixed)
    return next((c for c in found if c.fits and c.runnable), None)


def longest(stats: ModelStats, cluster, method: str, offload: bool):
    """Binary search over multiples of STEP: fitting is monotone in the row length for a fixed plan space."""
    low, high = 0, 1024 * 1024 // STEP  # up to 1M tokens
    best = None
    while low < high:
        mid = (low + high + 1) // 2
        found = best_fitting(stats, cluster, mid * STEP, method, offload)
        if found is not None:
            low, best = mid, found
        else:
            high = mid - 1
    return low * STEP, best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpu", default="H100")
    parser.add_argument("--host-memory", default=None, help="per node (default: the planner's 256 GiB per GPU)")
    args = parser.parse_args()
    stats = ModelStats.from_config(load_model_config("llama-3-8b"))
    cluster = make_cluster(1, 1, args.gpu, host_memory=args.host_memory)
    host = cluster.host_bytes_per_node / GiB
    print(f"Llama-3-8B on one {args.gpu}, host memory {host:.0f} GiB, bf16, 1 row per step")
    for method in ("full", "lora"):
        for offload in (False, True):
            seq, choice = longest(stats, cluster, method, offload)
            if choice is None:
                print(f"{method:5} offload={offload!s:5}: nothing fits")
                continue
            print(
                f"{method:5} offload={offload!s:5}: {seq:>9,} tokens  {describe(choice.plan)}  "
                f"peak {choice.memory.total_bytes / GiB:.1f} GiB  step {choice.time.step_s:.1f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
