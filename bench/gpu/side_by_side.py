"""bigtrain side by side with torchtitan, torchtune and the HF Trainer: same GPU, model, tokens per step and settings.

    python bench/gpu/side_by_side.py --model llama-1b --jsonl OUT.jsonl          # every run; prints a Markdown table
    python bench/gpu/side_by_side.py --model llama-8b-L4 --runs bigtrain:eager,torchtitan:eager
    python bench/gpu/side_by_side.py --report OUT.jsonl                          # the table from recorded runs

The peers are not bigtrain's dependencies: install them in the benchmark's environment only
(`pip install torchtitan==0.3.0 torchtune==0.6.1`, with their own requirements; `bench/gpu/peers.py` says how each
is driven). Every run is its own process (fresh allocator and compile caches) with a time limit; one that fails is
recorded with its error and the rest go on.

What is the same in every run: the architecture (`MODELS`), `seq_len` x `batch` tokens per optimizer step (one
micro-batch, no accumulation, no activation checkpointing), random token ids, AdamW, gradient clipping at 1.0, bf16
compute. What each framework decides itself is left at its own default and named in `peers.py` (torchtitan and
bigtrain wrap the model in FSDP2 with bf16 parameters for compute and fp32 master weights; torchtune's single-device
recipe keeps the parameters and AdamW's states in bf16; the HF Trainer runs autocast over fp32 parameters).
Measured: the median step time over the timed steps (CUDA synchronised), tokens/s, MFU (model FLOPs as the planner
counts them, `cost.model_flops_per_token`, over the GPU's bf16 dense peak from `planner/hardware.py`) and the peak of
`torch.cuda.max_memory_allocated` / `max_memory_reserved` over the training steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from shapes import MODELS, SHAPES, summary, timed_steps  # noqa: E402  (the runs' shared part; peers.py too)

MODES = ("eager", "compile", "fp8")  # fp8 = torch.compile + float8 rowwise linears (torchao), as torchtitan runs it
RUNS = (
    "bigtrain:eager",
    "bigtrain:compile",
    "bigtrain:fp8",
    "bigtrain:fp8-tensorwise",
    "torchtitan:eager",
    "torchtitan:compile",
    "torchtitan:fp8",
    "hf-trainer:eager",
    "hf-trainer:compile",
    "torchtune:eager",
    "torchtune:compile",
    "torchtune-lora:eager",
    "bigtrain-lora:eager",
)
def run_bigtrain(model: str, mode: str, lora: bool = False) -> dict[str, Any]:
    """bigtrain's own build and step (``build_engine`` + ``train_step``, what ``bigtrain train`` runs) on one GPU."""
    import torch
    import torch.distributed as dist

    from bigtrain.config.load import build_dataclass
    from bigtrain.config.resolve import resolve_plan
    from bigtrain.config.schema import RecipeConfig
    from bigtrain.data.batch import MicroBatch
    from bigtrain.engine import build_engine, build_options, train_step
    from bigtrain.job import named_job
    from bigtrain.models.build import load_hf_config
    from bigtrain.train.optim import build_optimizer, build_scheduler

    seq, batch = SHAPES[model]
    train: dict[str, Any] = {"global_batch_size": batch, "mixed_precision": "bf16", "compile": mode != "eager"}
    if mode.startswith("fp8"):
        train["fp8"] = "tensorwise" if mode == "fp8-tensorwise" else "rowwise"
    raw: dict[str, Any] = {
        "model": {"config": MODELS[model]},
        "data": {"seq_len": seq},
        "train": train,
        "parallel": {"backend": "fsdp2", "zero_stage": 2, "micro_batch_size": batch},
    }
    if lora:  # torchtune's LoRA recipe for Llama-3.2-1B: rank 64, alpha 128, attention q/v/o and the MLP
        raw["train"]["method"] = "lora"
        raw["lora"] = {"r": 64, "alpha": 128, "target_modules": ["q_proj", "v_proj", "o_proj", "gate_proj",
                                                                 "up_proj", "down_proj"]}
    cfg = build_dataclass(RecipeConfig, raw, "")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        plan = resolve_plan(cfg.parallel, 1, cfg.train)
        hf_config = load_hf_config(cfg.model)
        engine = build_engine(
            build_options(cfg, hf_config, plan, device),
            cfg.train,
            lambda params: build_optimizer(params, cfg.train),
            lambda optimizer: build_scheduler(optimizer, cfg.train),
            objective=named_job().objective.make,  # a causal LM's next-token loss
        )
        torch.cuda.reset_peak_memory_stats()
        generator = torch.Generator(device="cuda").manual_seed(0)
        ids = torch.randint(0, hf_config.vocab_size, (batch, seq), device=device, generator=generator)
        batches = [MicroBatch.of_ids(ids)]
        tokens = float(batch * (seq - 1))
        return summary(model, timed_steps(lambda: train_step(engine, batches, tokens, cfg.train.grad_clip)))
    finally:
        dist.destroy_process_group()


def run_one(name: str, model: str) -> dict[str, Any]:
    framework, mode = name.split(":")
    if framework == "bigtrain":
        return run_bigtrain(model, mode)
    if framework == "bigtrain-lora":
        return run_bigtrain(model, mode, lora=True)
    import peers

    return peers.RUNNERS[framework](model, mode)


def table(records: list[dict[str, Any]]) -> str:
    lines = [
        "| model | run | tokens/step | step s | tokens/s | MFU | peak allocated GiB | peak reserved GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['run']} | | failed: {r['error'][:160]} | | | | |")
            continue
        lines.append(
            f"| {r['model']} | {r['run']} | {r['tokens_per_step']:,} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} "
            f"| {r['mfu']:.1%} | {r['peak_allocated_gib']:.2f} | {r['peak_reserved_gib']:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="llama-1b")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated framework:mode names")
    parser.add_argument("--jsonl", help="append each run's record here")
    parser.add_argument("--report", help="print the table of a recorded JSONL file and exit")
    parser.add_argument("--timeout", type=float, default=240, help="seconds one run may take")
    parser.add_argument("--budget", type=float, default=1e9, help="seconds for all runs; later runs are skipped")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # inside a run's own process
    args = parser.parse_args()
    if args.report:
        print(table([json.loads(line) for line in Path(args.report).read_text().splitlines() if line.strip()]))
        return 0
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args.model)), flush=True)
        return 0
    records, start = [], time.monotonic()
    for name in args.runs.split(","):
        left = args.budget - (time.monotonic() - start)
        if left < 30:
            print(f"skipped {name}: the budget is spent", flush=True)
            continue
        begun = time.monotonic()
        command = [sys.executable, __file__, "--model", args.model, "--one", name]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=min(args.timeout, left))
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if lines:
                record = json.loads(lines[-1][len("RESULT ") :])
            else:
                record = {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]}
                record["error"] = record["error"][0]
                print((done.stderr or "")[-3000:], flush=True)
        except subprocess.TimeoutExpired:
            record = {"error": f"over the {min(args.timeout, left):.0f} s limit"}
        record.update(run=name, model=args.model, wall_s=time.monotonic() - begun)
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "step_s_all"}), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(record) + "\n")
    print(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
