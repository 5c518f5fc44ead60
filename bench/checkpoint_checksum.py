"""What the checkpoint checksums cost: a DCP save of a model's and AdamW's state against the checksum of the shard it
wrote (what each rank adds after writing, ``checkpoint/layout.write_rank_checksums``), and the check a start runs.

    python bench/checkpoint_checksum.py [--params 100e6] [--repeat 3] > bench/results/checkpoint_checksum_cpu.md

One process writes one shard, as each rank of a job does for its own (the shards are checksummed in parallel, each
by its writer). Times are the median of ``--repeat`` saves into a fresh folder each.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from bigtrain.checkpoint.layout import file_checksum, write_rank_checksums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6, help="parameters (fp32 weights + 2 AdamW states)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = int(args.params)
    chunk = 4 * 2**20
    state = {
        f"{kind}.{i}": torch.randn(min(chunk, n - i * chunk))
        for kind in ("model", "exp_avg", "exp_avg_sq")
        for i in range((n + chunk - 1) // chunk)
    }
    saves, sums, checks = [], [], []
    with tempfile.TemporaryDirectory(dir=".") as root:
        for r in range(args.repeat):
            folder = Path(root) / f"step_{r}"
            t0 = time.perf_counter()
            dcp.save(state, checkpoint_id=folder, no_dist=True)
            t1 = time.perf_counter()
            write_rank_checksums(folder, 0)
            t2 = time.perf_counter()
            for f in sorted(folder.glob("*.distcp")):
                file_checksum(f)
            t3 = time.perf_counter()
            saves.append(t1 - t0)
            sums.append(t2 - t1)
            checks.append(t3 - t2)
        size = sum(f.stat().st_size for f in (Path(root) / "step_0").glob("*.distcp"))
    save, checksum, check = (statistics.median(x) for x in (saves, sums, checks))
    print(f"# Checkpoint checksum cost ({torch.__version__}, {torch.get_num_threads()} threads)\n")
    print("| state | shard | DCP save | checksum of the shard | share of the save | check at start |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {n / 1e6:.0f}M params fp32 + AdamW | {size / 2**30:.2f} GiB | {save:.2f} s | {checksum:.2f} s | "
        f"{checksum / save:.1%} | {check:.2f} s |"
    )


if __name__ == "__main__":
    main()
