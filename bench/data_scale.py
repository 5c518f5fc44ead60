"""Start-up and memory against the data's size: bigtrain (its data cache) beside TRL's ``SFTTrainer`` (its
``datasets`` cache), on the same chat records, model and batch.

    python bench/data_scale.py                          # 2k, 20k, 200k records (~25 min on 2 CPU cores)
    python bench/data_scale.py --sizes 2000,1000000     # and the million (~1 h more)
    python bench/data_scale.py --no-trl                 # bigtrain alone
    python bench/data_scale.py --prepare                # and the cache build alone, on 1 CPU and on all
    python bench/data_scale.py --sizes '' --images 2000,200000 --corpus 2000,1000000   # image folders, corpora
    python bench/data_scale.py --sizes '' --stream 2000,1000000     # the chat records streamed (data.streaming)

Each size: the chat demo's 2,000 conversations (``recipes/make_chat_demo.py``) repeated to N records in a ``.jsonl``,
then for each trainer a first start (an empty cache) and a second start (the cache the first left), each a fresh
2-process job on this machine training 2 steps of ``recipes/chat_finetune.yaml``'s shape (a tiny Llama, rows of 512
tokens, global batch 8 = micro 2 x 2 ranks x accumulation 2): the launch-to-exit wall time, and the largest peak
resident set of its two ranks. bigtrain runs ``bigtrain train --nproc 2`` with ``data.cache_dir`` in the bench's
folder; TRL runs under ``torchrun --nproc-per-node 2`` with ``HF_DATASETS_CACHE`` there (its tokenised ``map`` is
cached by ``datasets``, the main process first). Prints a Markdown table; ``--out FILE`` writes it too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS, SEQ = 2, 512


def trl_worker(data: str, model: str, out: str) -> None:
    """One rank of TRL's SFTTrainer on the chat records (run under torchrun); rank 0 prints the ranks' peak RSS."""
    import torch.distributed as dist
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=out,
        max_steps=STEPS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_length=SEQ,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model),
        args=args,
        train_dataset=load_dataset("json", data_files=data, split="train"),
        processing_class=tokenizer,
    )
    trainer.train()
    peak = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, peak[0])
    if dist.get_rank() == 0:
        print("PEAK_RSS_MIB", max(gathered), flush=True)


def chat_records(folder: Path, n: int) -> Path:
    """The demo's conversations repeated to ``n`` lines."""
    lines = (folder / "demo" / "train.jsonl").read_text().splitlines()
    path = folder / f"chat_{n}.jsonl"
    if not path.exists():
        with path.open("w") as f:
            for i in range(n):
                f.write(lines[i % len(lines)] + "\n")
    return path


def timed(command: list[str], folder: Path, what: str, env: dict | None = None) -> tuple[float, str, str]:
    """``command`` run in ``folder`` to its exit: (wall seconds, stdout, stderr); a failure stops the bench."""
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout, proc.stderr


def run_bigtrain(folder: Path, data: Path, tag: str) -> dict:
    sets = {
        "model.name_or_path": folder / "demo" / "base",
        "data.path": data,
        "data.eval_path": "null",
        "data.cache_dir": folder / "cache",
        "train.eval_every": 0,
    }
    return run_recipe(folder, REPO / "recipes" / "chat_finetune.yaml", sets, tag)


def run_recipe(folder: Path, recipe: Path, sets: dict, tag: str) -> dict:
    """``bigtrain train RECIPE --nproc 2`` for STEPS steps, nothing saved: wall time, the ranks' largest peak RSS,
    and how the start came by data.path's cache entry."""
    sets = {
        **sets,
        "train.steps": STEPS,
        "train.log_to": "jsonl",
        "checkpoint.every": 0,
        "checkpoint.save_final_model": "false",
        "output_dir": folder / f"run_{tag}",
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    command = [sys.executable, "-m", "bigtrain", "train", str(recipe), *args, "--nproc", "2"]
    seconds, _, stderr = timed(command, folder, f"bigtrain ({tag})")
    peaks = re.search(r"peak RSS per rank: ([\d, MiB]+);", stderr)
    built = re.search(r"data(?:\.path|\.sources\[0\]\.path): data cache \S+ \(([^)]*)\)", stderr)
    mib = max(int(p.replace(",", "")) for p in re.findall(r"([\d,]+) MiB", peaks.group(1))) if peaks else None
    return {"seconds": seconds, "peak_mib": mib, "cache": built.group(1) if built else "none: mapped as it is"}


def image_folder(folder: Path, n: int) -> Path:
    """``n`` small PNGs (32 px, a colour per class) in 10 class folders."""
    from PIL import Image

    root = folder / f"images_{n}"
    for i in range(n):
        path = root / f"class_{i % 10}" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (32, 32), (25 * (i % 10), 7 * (i % 37), 3 * (i % 83))).save(path)
    return root


def run_images(folder: Path, n: int) -> dict:
    root = image_folder(folder, n)
    sets = {"data.path": root, "data.eval_fraction": 0.0, "train.eval_every": 0, "data.cache_dir": folder / "cache"}
    recipe = REPO / "recipes" / "image_classifier.yaml"
    first = run_recipe(folder, recipe, sets, f"images_{n}_first")
    return {"images": n, "first": first, "second": run_recipe(folder, recipe, sets, f"images_{n}_second")}


def run_corpus(folder: Path, n: int) -> dict:
    """A pre-training corpus of ``n`` rows of 128 tokens in two flat uint16 token files (70% and 30% of the rows),
    blended by those weights, trained on the quick start's model."""
    import numpy as np

    paths = []
    for name, share in (("web", 0.7), ("code", 0.3)):
        rows = max(1, round(share * n))
        path = folder / f"{name}_{n}.bin"
        np.random.default_rng(rows).integers(0, 257, size=rows * 128, dtype=np.uint16).tofile(path)
        paths.append(f"{{path: {path}, weight: {share}}}")
    sets = {"data.sources": f"[{', '.join(paths)}]", "data.seq_len": 128, "data.cache_dir": folder / "cache"}
    recipe = REPO / "recipes" / "quickstart.yaml"
    first = run_recipe(folder, recipe, sets, f"corpus_{n}_first")
    return {"rows": n, "first": first, "second": run_recipe(folder, recipe, sets, f"corpus_{n}_second")}


def run_stream(folder: Path, n: int) -> dict:
    """The chat records read as a stream (``data.streaming``): nothing built ahead, the first rows read at the first
    step, whatever the file's size."""
    sets = {
        "model.name_or_path": folder / "demo" / "base",
        "data.path": chat_records(folder, n),
        "data.streaming": "true",
        "data.eval_path": "null",
        "train.eval_every": 0,
    }
    return {"records": n, **run_recipe(folder, REPO / "recipes" / "chat_finetune.yaml", sets, f"stream_{n}")}


def run_prepare(folder: Path, data: Path, tag: str, cpus: str | None) -> float:
    """``bigtrain prepare`` into an empty cache, on the CPUs ``cpus`` (taskset's list; None: every one)."""
    recipe = REPO / "recipes" / "chat_finetune.yaml"
    sets = {"model.name_or_path": folder / "demo" / "base", "data.path": data, "data.eval_path": "null",
            "data.cache_dir": folder / f"prepare_{tag}", "train.eval_every": 0}  # fmt: skip
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    command = [sys.executable, "-m", "bigtrain", "prepare", str(recipe), *args]
    return timed((["taskset", "-c", cpus] if cpus else []) + command, folder, f"bigtrain prepare ({tag})")[0]


def run_trl(folder: Path, data: Path, tag: str) -> dict:
    env = {**os.environ, "HF_DATASETS_CACHE": str(folder / "hf_datasets"), "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533"]
    worker = [__file__, "--trl-worker", str(data), str(folder / "demo" / "base"), str(folder / f"trl_{tag}")]
    seconds, stdout, _ = timed(launch + worker, folder, f"TRL ({tag})", env)
    peak = re.search(r"PEAK_RSS_MIB (\d+)", stdout)
    return {"seconds": seconds, "peak_mib": int(peak.group(1)) if peak else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2000,20000,200000")
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--prepare", action="store_true", help="also time bigtrain prepare on 1 CPU and on all")
    parser.add_argument("--images", default="", help="image folders of these many PNGs, e.g. 2000,200000")
    parser.add_argument("--corpus", default="", help="blended token corpora of these many rows, e.g. 2000,1000000")
    parser.add_argument("--stream", default="", help="chat records streamed (data.streaming), e.g. 2000,1000000")
    parser.add_argument("--out", help="also write the table here")
    parser.add_argument("--trl-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(*args.trl_worker)
        return
    with tempfile.TemporaryDirectory(prefix="data_scale_") as tmp:
        folder = Path(tmp)
        subprocess.run([sys.executable, str(REPO / "recipes" / "make_chat_demo.py"), "demo"], cwd=folder, check=True,
                       capture_output=True)  # fmt: skip
        rows, images, corpora, streams = [], [], [], []
        for n in [int(s) for s in args.images.split(",") if s]:
            images.append(run_images(folder, n))
            print(json.dumps(images[-1]), flush=True)
        for n in [int(s) for s in args.corpus.split(",") if s]:
            corpora.append(run_corpus(folder, n))
            print(json.dumps(corpora[-1]), flush=True)
        for n in [int(s) for s in args.stream.split(",") if s]:
            streams.append(run_stream(folder, n))
            print(json.dumps(streams[-1]), flush=True)
        for n in [int(s) for s in args.sizes.split(",") if s]:
            data = chat_records(folder, n)
            size = data.stat().st_size / 2**20
            row = {"records": n, "MB": size}
            if args.prepare:  # the build alone: one CPU against every CPU of the machine
                row["prepare 1 cpu"] = run_prepare(folder, data, f"{n}_1cpu", "0")
                row["prepare all cpus"] = run_prepare(folder, data, f"{n}_all", None)
            row["bigtrain first"] = run_bigtrain(folder, data, f"{n}_first")
            row["bigtrain second"] = run_bigtrain(folder, data, f"{n}_second")
            if not args.no_trl:
                row["trl first"] = run_trl(folder, data, f"{n}_first")
                row["trl second"] = run_trl(folder, data, f"{n}_second")
            rows.append(row)
            print(json.dumps(row), flush=True)
    table = (
        []
        if not rows
        else [
            "| records (.jsonl) | bigtrain first start | bigtrain second start | bigtrain peak RSS per rank (first, "
            "second) | TRL first start | TRL second start | TRL peak RSS per rank (first, second) |",
            "|---|---|---|---|---|---|---|",
        ]
    )
    for row in rows:
        b1, b2 = row["bigtrain first"], row["bigtrain second"]
        cells = [
            f"{row['records']:,} ({row['MB']:.1f} MB)",
            f"{b1['seconds']:.1f} s (cache {b1['cache']})",
            f"{b2['seconds']:.1f} s (cache {b2['cache']})",
            f"{b1['peak_mib']:,}, {b2['peak_mib']:,} MiB",
        ]
        if "trl first" in row:
            t1, t2 = row["trl first"], row["trl second"]
            cells += [f"{t1['seconds']:.1f} s", f"{t2['seconds']:.1f} s", f"{t1['peak_mib']:,}, {t2['peak_mib']:,} MiB"]
        else:
            cells += ["–", "–", "–"]
        table.append("| " + " | ".join(cells) + " |")
    for title, found, what in (
        ("images (PNG folder)", images, "images"),
        ("rows of 128 tokens, 2 sources", corpora, "rows"),
    ):
        if found:
            table += ["", f"| {title} | first start | second start | peak RSS per rank (first, second) |"]
            table += ["|---|---|---|---|"]
            for r in found:
                a, b = r["first"], r["second"]
                table.append(
                    f"| {r[what]:,} | {a['seconds']:.1f} s (cache {a['cache']}) | {b['seconds']:.1f} s (cache "
                    f"{b['cache']}) | {a['peak_mib']:,}, {b['peak_mib']:,} MiB |"
                )
    if streams:
        table += ["", "| records streamed (.jsonl) | start to done | peak RSS per rank |", "|---|---|---|"]
        table += [f"| {r['records']:,} | {r['seconds']:.1f} s | {r['peak_mib']:,} MiB |" for r in streams]
    if args.prepare:
        table += ["", "| records | bigtrain prepare, 1 CPU | bigtrain prepare, every CPU |", "|---|---|---|"]
        table += [f"| {r['records']:,} | {r['prepare 1 cpu']:.1f} s | {r['prepare all cpus']:.1f} s |" for r in rows]
    text = "\n".join(table)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
