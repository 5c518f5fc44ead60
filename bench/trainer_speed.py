"""bigtrain's trainer against hand-written loops and DeepSpeed used directly: same model, data shape and plan.

    python bench/trainer_speed.py            # ~8 minutes on 2 CPU cores: the table of results/trainer_speed_cpu.md
    python bench/trainer_speed.py --reps 1   # one round

Contenders (each a 2-rank gloo job under torchrun, fp32, a Llama of width 512, 4 blocks, 2k vocabulary, 256 tokens,
global batch 8 = micro-batch 4 x 2 ranks):
- ``bigtrain fsdp2`` / ``bigtrain ddp`` / ``bigtrain deepspeed``: ``bigtrain train`` with that plan (its data
  loader, loss normalised by the global batch's tokens, clipping, AdamW, logging);
- ``hand fsdp2``: ``fully_shard`` on every block and the root, a summed cross-entropy over the global token count,
  ``clip_grad_norm_``, torch's AdamW: what a person would write from the FSDP2 tutorial;
- ``hand ddp``: the same loop around ``DistributedDataParallel``;
- ``deepspeed direct``: ``deepspeed.initialize`` with a ZeRO-2 config and the same AdamW, ``engine.backward``,
  ``engine.step``.
Runs alternate (every contender once per round, ``--reps`` rounds); each run's step time is the median of its steps
after the first two, and the table shows the median over rounds. Peak memory: rank 0's largest resident set (max RSS),
which on a CPU host is all the memory the rank holds (bigtrain's metrics.jsonl records the same). accelerate's
FSDP2 plugin is not here: without a GPU accelerate runs its CPU path (plain DDP), so it would measure the DDP row
again.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_time import BATCH, MODEL, SEQ  # noqa: E402  (the same model and data shape as the step-time bench)

MICRO, STEPS, LR = 4, 8, 1e-3
BIGTRAIN = {"fsdp2": {"backend": "fsdp2", "zero_stage": 3}, "ddp": {"backend": "ddp"}, "deepspeed": {}}
BIGTRAIN["deepspeed"] = {"backend": "deepspeed", "zero_stage": 2}
CONTENDERS = ["bigtrain fsdp2", "hand fsdp2", "bigtrain ddp", "hand ddp", "bigtrain deepspeed", "deepspeed direct"]


def worker(kind: str) -> None:
    """One rank of a hand-written loop (run under torchrun); rank 0 prints one JSON line of step times."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, LlamaConfig

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**{k: v for k, v in MODEL.items() if k != "model_type"}))
    optimizer = None
    if kind == "hand fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.model.layers:
            fully_shard(block)
        fully_shard(model)
    elif kind == "hand ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    engine = None
    if kind == "deepspeed direct":
        import deepspeed

        config = {
            "train_micro_batch_size_per_gpu": MICRO,
            "gradient_accumulation_steps": BATCH // (MICRO * world),
            "zero_optimization": {"stage": 2},
            "gradient_clipping": 1.0,
        }
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    generator = torch.Generator().manual_seed(rank)
    global_tokens = BATCH * (SEQ - 1)
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        for _ in range(BATCH // (MICRO * world)):
            ids = torch.randint(0, MODEL["vocab_size"], (MICRO, SEQ), generator=generator)
            logits = (engine or model)(input_ids=ids).logits
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum")
            # the gradient averages over ranks: scale so that it is the sum over the global batch's tokens
            loss = loss * world / global_tokens
            if engine is not None:
                engine.backward(loss)
            else:
                loss.backward()
        if engine is not None:
            engine.step()
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    if rank == 0:  # the same measure as bigtrain's metrics.jsonl on a CPU: rank 0's peak resident set
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print("RESULT " + json.dumps({"step_s": statistics.median(times[2:]), "peak_rss": rss}))
    dist.destroy_process_group()


def run_bigtrain(backend: str, folder: Path) -> dict[str, float]:
    recipe = {
        "model": {"config": MODEL},
        "data": {"path": "builtin:stories", "seq_len": SEQ},
        "train": {"steps": STEPS, "global_batch_size": BATCH, "lr": LR},
        "parallel": {**BIGTRAIN[backend], "micro_batch_size": MICRO},
        "checkpoint": {"every": 0, "save_final_model": False},
        "output_dir": str(folder / "out"),
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "bigtrain", "train", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    records = [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]
    step = statistics.median(BATCH * SEQ / r["tokens_per_s"] for r in records[2:])
    return {"step_s": step, "peak_rss": max(r["peak_mem_bytes"] for r in records)}


def run_hand(kind: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__, "--worker", kind]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=3, help="rounds of alternating runs (default 3)")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # two ranks on two cores, as bigtrain's launcher sets
    results: dict[str, list[dict[str, float]]] = {c: [] for c in CONTENDERS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for name in CONTENDERS:
                kind, _, backend = name.partition(" ")
                if kind == "bigtrain":
                    folder = Path(tmp) / f"{backend}-{rep}"
                    folder.mkdir()
                    results[name].append(run_bigtrain(backend, folder))
                else:
                    results[name].append(run_hand(name))
                print(f"round {rep + 1}: {name} {results[name][-1]['step_s']:.3f} s", file=sys.stderr, flush=True)
    print("| contender | s/step (median of rounds) | rounds | steps/s | vs hand-written | rank 0 peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    reference = {"fsdp2": "hand fsdp2", "ddp": "hand ddp", "deepspeed": "deepspeed direct"}
    for name in CONTENDERS:
        step = statistics.median(r["step_s"] for r in results[name])
        kind, _, backend = name.partition(" ")
        ratio = ""
        if kind == "bigtrain":
            ref = statistics.median(r["step_s"] for r in results[reference[backend]])
            ratio = f"{ref / step:.2f}x"
        rounds = ", ".join(f"{r['step_s']:.3f}" for r in results[name])
        rss = max(r["peak_rss"] for r in results[name]) / 2**20
        print(f"| {name} | {step:.3f} | {rounds} | {1 / step:.2f} | {ratio} | {rss:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
