"""Reading image conversations (``model.task: image-text-to-text``) at a first start (the data cache built: every
conversation rendered, its image opened and expanded by the processor) and a second (the entry mapped), per rank.

    python bench/image_chat_cache.py                    # 2,000 and 20,000 conversations (~1 min on 2 CPU cores)
    python bench/image_chat_cache.py --sizes 200000

Each size: a ``.jsonl`` of one-image conversations over three PNGs (16, 24 and 32 pixels square) and the tiny
Qwen2.5-VL of ``recipes/make_vlm_demo.py`` (its processor, rows of 160 tokens); each start is a fresh process that
reads the data as a rank's start-up does (``load_image_chats``): its wall time and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_start(folder: Path, n: int) -> None:
    """Read the ``n`` conversations once (run in a fresh process); print seconds, the cache line and peak RSS."""
    import resource
    import time

    from bigtrain.config.schema import DataConfig
    from bigtrain.data.image_chat_cache import load_image_chats
    from bigtrain.data.processor import load_processor

    path = folder / f"chats_{n}.jsonl"
    processor = load_processor(str(folder / "qwen"), "model.name_or_path", None, None)
    cfg = DataConfig(path=str(path), seq_len=160, cache_dir=str(folder / "cache"))
    start = time.perf_counter()
    data = load_image_chats(cfg, "data.path", str(path), processor, 0)
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(json.dumps({"seconds": seconds, "note": data.cache_note, "peak_mib": rss, "rows": data.num_rows}))


def prepare(folder: Path, sizes: list[int]) -> None:
    import numpy as np
    from PIL import Image

    sys.path.insert(0, str(REPO / "recipes"))
    from make_vlm_demo import save_tiny_vlm

    save_tiny_vlm(folder / "qwen", "qwen2_5_vl")
    for side in (16, 24, 32):
        Image.fromarray(np.full((side, side, 3), side * 5, dtype=np.uint8)).save(folder / f"{side}.png")
    for n in sizes:
        with open(folder / f"chats_{n}.jsonl", "w") as f:
            for i in range(n):
                side = (16, 24, 32)[i % 3]
                user = [{"type": "image", "image": f"{side}.png"}, {"type": "text", "text": f"What is {i}?"}]
                answer = {"role": "assistant", "content": f"A {i}."}
                f.write(json.dumps({"messages": [{"role": "user", "content": user}, answer]}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2000,20000")
    parser.add_argument("--one-start", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_start:
        one_start(Path(args.one_start[0]), int(args.one_start[1]))
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]
    lines = ["| conversations | first start (cache built) | second start (cache read) | peak RSS (first, second) |",
             "|---|---|---|---|"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="image_chats_") as tmp:
        folder = Path(tmp)
        prepare(folder, sizes)
        for n in sizes:
            runs = []
            for _ in range(2):
                command = [sys.executable, __file__, "--one-start", str(folder), str(n)]
                out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
                runs.append(json.loads(out.strip().splitlines()[-1]))
            first, second = runs
            lines.append(f"| {n:,} | {first['seconds']:.2f} s | {second['seconds']:.2f} s | "
                         f"{first['peak_mib']:,}, {second['peak_mib']:,} MiB |")  # fmt: skip
            print(json.dumps({"conversations": n, "first": first, "second": second}), flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
