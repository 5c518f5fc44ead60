"""Rank 0 of an N-GPU job, run for real on this machine's one GPU, against the planner's prediction.

    python bench/rank0_on_device.py                 # every case; prints a Markdown table
    python bench/rank0_on_device.py --cases a,b     # some of them
    python bench/rank0_on_device.py --list

A fake process group (``torch.testing._internal.distributed.fake_pg``: collectives that move nothing) stands in for
the other N-1 ranks, so the model is built, sharded and stepped by bigtrain's own code (``build_engine`` +
``train_step``, as ``bigtrain train`` does) with rank 0's real shard sizes, buffers and kernels on the real device.
What it measures:
- peak memory of the training steps: ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved``, reset after
  the model is built (the build's own peak is reported apart: materialisation is a start-up transient);
- step time, median of the timed steps after warm-up. The collectives do no work, so this is the *compute* part of
  a step, compared with the planner's compute term (``estimate_time(...).compute_s``), not its whole step time.
Parameters after a fake all-gather hold whatever the buffer held (the loss is NaN soon): memory and kernel times do
not depend on values.

Needs CUDA. Each case runs in its own process (fresh allocator, fresh process group); a case that fails is reported
with its error and the rest go on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cases import LLAMA_3_2_1B  # noqa: E402

from bigtrain.data.batch import MicroBatch
from bigtrain.planner.model_stats import load_model_config

REPO = Path(__file__).resolve().parents[1]


def _trimmed(preset: str, layers: int) -> dict[str, Any]:
    """A published architecture at full width with fewer decoder layers (the depth only multiplies block terms)."""
    config = {**load_model_config(preset), "num_hidden_layers": layers}
    config.pop("layer_types", None)  # one per layer: transformers rebuilds it for the new depth
    return config


LLAMA_1B = LLAMA_3_2_1B  # Llama-3.2-1B's published config.json (tests/cases.py)
MODELS: dict[str, dict[str, Any]] = {
    "llama-1b": LLAMA_1B,
    "llama-8b-L8": _trimmed("llama-3-8b", 8),
    "qwen2.5-7b-L6": _trimmed("qwen2.5-7b", 6),
    "mistral-7b-L8": _trimmed("mistral-7b", 8),
}


@dataclass(frozen=True)
class Rank0Case:
    name: str
    model: str
    world: int
    parallel: dict[str, Any]
    seq_len: int
    global_batch: int
    precision: str = "bf16"
    compile: bool = False
    fp8: str = "none"  # train.fp8
    steps: int = 5  # the first `warmup` are not timed
    warmup: int = 2
    extra: dict[str, Any] = field(default_factory=dict)

    def workload(self):  # noqa: ANN201 - bigtrain is imported inside the case's process
        from bigtrain.config.workload import Workload

        return Workload(seq_len=self.seq_len, global_batch_size=self.global_batch, mixed_precision=self.precision,
                        compile=self.compile, fp8=self.fp8)


def _fsdp(zero: int, mb: int, ac: str = "none", **kw: Any) -> dict[str, Any]:
    return {"backend": "fsdp2", "zero_stage": zero, "micro_batch_size": mb, "activation_checkpointing": ac, **kw}


CASES = [
    Rank0Case("1b-z3-N8", "llama-1b", 8, _fsdp(3, 2), 2048, 16),
    Rank0Case("1b-z2-N8-accum2", "llama-1b", 8, _fsdp(2, 1), 4096, 16),
    Rank0Case("1b-z3-N8-accum2-once", "llama-1b", 8, _fsdp(3, 1, grad_reduce="once_per_step"), 4096, 16),
    Rank0Case(
        "1b-ddp-N8-full-accum2",
        "llama-1b",
        8,
        {"backend": "ddp", "micro_batch_size": 4, "activation_checkpointing": "full"},
        2048,
        64,
    ),
    Rank0Case("1b-z3-N8-offload", "llama-1b", 8, _fsdp(3, 2, offload_params=True), 2048, 16),
    Rank0Case("8b-z3-N64-full", "llama-8b-L8", 64, _fsdp(3, 2, "full"), 4096, 128),
    Rank0Case(
        "8b-z3-N64-full-accum2-once", "llama-8b-L8", 64, _fsdp(3, 2, "full", grad_reduce="once_per_step"), 4096, 256
    ),
    Rank0Case("8b-z3-N8-offload-full", "llama-8b-L8", 8, _fsdp(3, 2, "full", offload_params=True), 4096, 16),
    Rank0Case("8b-z3-N16-none-L8k", "llama-8b-L8", 16, _fsdp(3, 1), 8192, 16),
    Rank0Case("8b-hsdp-2x8-full", "llama-8b-L8", 16, _fsdp(3, 4, "full", dp_replicate=2), 2048, 64),
    Rank0Case("8b-z3-N16-tp2", "llama-8b-L8", 16, _fsdp(3, 2, tp=2), 2048, 16),
    Rank0Case("mistral-z3-N8-tp4-full", "mistral-7b-L8", 8, _fsdp(3, 4, "full", tp=4), 4096, 8),
    Rank0Case("qwen7b-z2-N16-full", "qwen2.5-7b-L6", 16, _fsdp(2, 2, "full"), 4096, 32),
    Rank0Case("qwen7b-z3-N8-fp32", "qwen2.5-7b-L6", 8, _fsdp(3, 1), 2048, 8, precision="fp32"),
    # one GPU, no other ranks: throughput and MFU of a 1B model, checkpointing and torch.compile on and off
    Rank0Case("1b-1gpu-mb8", "llama-1b", 1, _fsdp(2, 8), 2048, 8),
    Rank0Case("1b-1gpu-mb8-full", "llama-1b", 1, _fsdp(2, 8, "full"), 2048, 8),
    Rank0Case("1b-1gpu-mb8-compile", "llama-1b", 1, _fsdp(2, 8), 2048, 8, compile=True, steps=6, warmup=3),
    Rank0Case("1b-1gpu-mb8-full-compile", "llama-1b", 1, _fsdp(2, 8, "full"), 2048, 8, compile=True, steps=6, warmup=3),
]
# The regret grid on one GPU (bench/gpu/regret_gpu.py reads its results): every single-GPU plan of micro-batch x
# checkpointing x (eager, compile, compile + fp8 rowwise) on FSDP2, and micro-batch x checkpointing on DDP (eager),
# Llama-3.2-1B, 8 sequences of 2048 tokens per step.
GRID = [
    Rank0Case(
        f"grid-{backend}-mb{mb}-{ac}-{variant}",
        "llama-1b",
        1,
        {"backend": backend, "micro_batch_size": mb, "activation_checkpointing": ac}
        | ({"zero_stage": 2} if backend == "fsdp2" else {}),
        2048,
        8,
        compile=variant != "eager",
        fp8="rowwise" if variant == "fp8" else "none",
        steps=6 if variant != "eager" else 5,
        warmup=3 if variant != "eager" else 2,
    )
    for backend, variants in (("fsdp2", ("eager", "compile", "fp8")), ("ddp", ("eager",)))
    for variant in variants
    for mb in (2, 8)
    for ac in ("none", "full")
]
# Not here: pp plans. torch's pipeline schedule exchanges stage metadata with recv_object_list before the first
# step, whose size the fake process group cannot answer.


def run_one(case: Rank0Case) -> dict[str, Any]:
    """Inside the case's own process: build with bigtrain, step, measure."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from bigtrain.config.load import build_dataclass
    from bigtrain.config.resolve import resolve_plan
    from bigtrain.config.schema import RecipeConfig
    from bigtrain.engine import build_engine, build_options, train_step
    from bigtrain.job import named_job
    from bigtrain.models.build import load_hf_config
    from bigtrain.train.optim import build_optimizer, build_scheduler

    cuda = torch.cuda.is_available()  # without CUDA (a check of this script on a laptop) times only, no memory
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    raw = {
        "model": {"config": MODELS[case.model]},
        "data": {"seq_len": case.seq_len},
        "train": {"global_batch_size": case.global_batch, "mixed_precision": case.precision, "compile": case.compile}
        | ({"fp8": case.fp8} if case.fp8 != "none" else {}),
        "parallel": case.parallel,
    }
    cfg: RecipeConfig = build_dataclass(RecipeConfig, raw, "")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=case.world)
    try:
        plan = resolve_plan(cfg.parallel, case.world, cfg.train)
        hf_config = load_hf_config(cfg.model)
        start = time.perf_counter()
        engine = build_engine(
            build_options(cfg, hf_config, plan, device),
            cfg.train,
            lambda params: build_optimizer(params, cfg.train),
            lambda optimizer: build_scheduler(optimizer, cfg.train),
            objective=named_job().objective.make,  # a causal LM's next-token loss
        )
        if plan.backend == "ddp":
            # The fake group's all-reduce completes with no value, which DDP's reducer refuses: a comm hook that
            # leaves each bucket as it is (what a one-rank all-reduce would return) stands in for it.
            engine.built.forward_module.register_comm_hook(None, _bucket_unchanged)
        sync()
        build_s = time.perf_counter() - start
        build_peak = torch.cuda.max_memory_allocated(device) if cuda else 0
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        accum = plan.grad_accum_steps(case.global_batch)
        batches = [
            MicroBatch.of_ids(
                torch.randint(0, hf_config.vocab_size, (plan.micro_batch_size, case.seq_len), device=device)
            )
            for _ in range(accum)
        ]
        global_tokens = float(case.global_batch * (case.seq_len - 1))
        times = []
        for _ in range(case.steps):
            sync()
            t0 = time.perf_counter()
            train_step(engine, batches, global_tokens, cfg.train.grad_clip)
            sync()
            times.append(time.perf_counter() - t0)
        timed = times[case.warmup :]
        return {
            "case": case.name,
            "plan": plan.to_dict(),
            "accum": accum,
            "build_s": build_s,
            "build_peak_bytes": build_peak,
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else 0,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if cuda else 0,
            "step_s_median": statistics.median(timed),
            "step_s_all": times,
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": torch.__version__,
        }
    finally:
        dist.destroy_process_group()


def _bucket_unchanged(state, bucket):  # unannotated: DDP rejects annotations not its own types
    import torch

    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def predict(case: Rank0Case, plan: dict[str, Any], profile: str | None = None) -> dict[str, float]:
    from bigtrain.config.plan import Plan
    from bigtrain.planner.cost import estimate_time
    from bigtrain.planner.hardware import make_cluster
    from bigtrain.planner.memory import estimate_memory
    from bigtrain.planner.model_stats import ModelStats

    stats = ModelStats.from_config(MODELS[case.model])
    p = Plan.from_dict(plan)
    memory = estimate_memory(stats, p, case.workload())
    cluster = make_cluster(case.world, None, "H200")
    if profile:  # the time model with this machine's measured rates (bigtrain probe) instead of the datasheet's
        from dataclasses import replace

        from bigtrain.planner.profile import gpu_from_profile, load_profile

        cluster = replace(cluster, gpu=gpu_from_profile(load_profile(profile), cluster.gpu))
    t = estimate_time(stats, p, cluster, case.workload())
    return {"predicted_bytes": memory.total_bytes, "predicted_compute_s": t.compute_s}


HEADER = (
    "| case | N | plan | seq | batch | accum | predicted GiB | allocated GiB | error | reserved GiB "
    "| predicted compute s | measured step s | measured/predicted | model TFLOP/s | MFU |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def table_row(case: Rank0Case, result: dict[str, Any]) -> str:
    """One Markdown row; MFU = model FLOPs of rank 0's share of the step over its time and the 989 TFLOP/s peak."""
    from bigtrain.planner.cost import model_flops_per_token
    from bigtrain.planner.model_stats import ModelStats

    gib = 2**30
    plan = result["plan"]
    layout = (
        f"{plan['backend']} z{plan['zero_stage']} dp{plan['dp_replicate']}x{plan['dp_shard']} tp{plan['tp']} "
        f"ac={plan['activation_checkpointing']} mb{plan['micro_batch_size']}"
        + (" offload" if plan["offload_params"] else "")
        + (f" {plan['grad_reduce']}" if result["accum"] > 1 else "")
        + (" compile" if case.compile else "")
        + (f" {case.precision}" if case.precision != "bf16" else "")
    )
    err = result["predicted_bytes"] / result["peak_allocated_bytes"] - 1
    step = result["step_s_median"]
    flops = model_flops_per_token(ModelStats.from_config(MODELS[case.model]), case.seq_len)
    tflops = flops * case.global_batch * case.seq_len / case.world / step / 1e12
    return (
        f"| {case.name} | {case.world} | {layout} | {case.seq_len} | {case.global_batch} | {result['accum']} "
        f"| {result['predicted_bytes'] / gib:.2f} | {result['peak_allocated_bytes'] / gib:.2f} | {err:+.1%} "
        f"| {result['peak_reserved_bytes'] / gib:.2f} | {result['predicted_compute_s']:.3f} | {step:.3f} "
        f"| {step / result['predicted_compute_s']:.2f} | {tflops:.0f} | {tflops / 989:.1%} |"
    )


def _append(path: str | None, record: dict[str, Any]) -> None:
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one case in this process, print JSON
    parser.add_argument("--jsonl", help="also append each result as a JSON line to this file")
    parser.add_argument("--report", help="print the table of a recorded JSONL (the last result of each case)")
    parser.add_argument(
        "--repredict", action="store_true", help="with --report: the predictions of today's planner, not the recorded"
    )
    parser.add_argument("--profile", help="with --repredict: time with this bigtrain probe profile (e.g. the H200's)")
    parser.add_argument("--budget", type=float, default=1e9, help="seconds for all cases; later cases are skipped")
    args = parser.parse_args()
    by_name = {c.name: c for c in CASES + GRID}
    if args.list:
        for c in CASES:
            print(c.name, json.dumps(asdict(c)))
        return 0
    if args.one:
        print("RESULT " + json.dumps(run_one(by_name[args.one])), flush=True)
        return 0
    if args.report:
        last = {r["case"]: r for r in map(json.loads, Path(args.report).read_text().splitlines())}
        print(HEADER)
        for name, result in last.items():
            error = result.get("error", "").strip().splitlines()
            if not error and args.repredict:
                result.update(predict(by_name[name], result["plan"], args.profile))
            print(f"| {name} | failed: {error[-1][:200]} |" if error else table_row(by_name[name], result))
        return 0
    names = args.cases.split(",") if args.cases else [c.name for c in CASES]
    if names == ["grid"]:
        names = [c.name for c in GRID]
    print(HEADER)
    start = time.monotonic()
    for name in names:
        case = by_name[name]
        left = args.budget - (time.monotonic() - start)
        if left < 20:
            print(f"| {name} | skipped: the budget is spent |", flush=True)
            continue
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--one", name], capture_output=True, text=True, cwd=REPO,
                timeout=min(900, left),
            )
        except subprocess.TimeoutExpired:
            print(f"| {name} | over the time left ({left:.0f} s) |", flush=True)
            continue
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"| {name} | failed: {err[:200]} |", flush=True)
            _append(args.jsonl, {"case": name, "error": proc.stderr[-4000:]})
            continue
        result = json.loads(lines[-1][len("RESULT ") :])
        result.update(predict(case, result["plan"]))
        result["spec"] = asdict(case)
        _append(args.jsonl, result)
        print(table_row(case, result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
