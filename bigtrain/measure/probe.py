"""``bigtrain probe``: measure what this machine really does, for the planner's time model.

- matmul rate (TFLOP/s) per dtype and shape: the shapes a decoder block runs (tokens x hidden x hidden-ish) and one
  large square product; bf16, fp16, fp32 (TF32 off, as training runs it) on the device the job would train on;
- memory bandwidth: a large device-to-device copy, bytes read plus bytes written per second;
- operator overhead: seconds per operator that does almost nothing (launch and dispatch);
- collective bandwidth over the ranks it was launched with (``bigtrain probe --nproc N`` or torchrun): all-gather,
  reduce-scatter and all-reduce of several sizes, as *bus* bandwidth (nccl-tests' convention: algorithm bandwidth
  times (n-1)/n for gather/scatter, 2(n-1)/n for all-reduce), so that one number per group describes the link, and
  their seconds, from which the planner fits a collective's latency (tp sends small all-reduces, many per step);
- tensor parallelism's machinery per decoder block (``probe_tp.py``): DTensor dispatch and wrapping beyond the
  matmuls, measured on a fake two-rank group, so also on one device.

Every figure is the median of timed repeats after warm-up (device synchronised around each timing). Rank 0 writes
the profile as JSON; collectives run on every rank with the job's own backend (NCCL on GPUs, gloo on CPUs).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bigtrain.measure.probe_decode import decode_overhead

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# (m, k, n): m tokens of a micro-batch through a k -> n projection, and one square product
# the small ones: a decode step's matmuls (a rank's rows of one generated token each: online RL's rollouts)
GPU_SHAPES = [(64, 4096, 4096), (256, 4096, 4096), (2048, 2048, 2048), (8192, 4096, 4096), (16384, 4096, 14336),
              (16384, 14336, 4096), (8192, 8192, 8192)]  # fmt: skip
CPU_SHAPES = [(8, 512, 512), (32, 512, 512), (256, 256, 256), (1024, 1024, 1024)]
# The projections of a decoder block as tensor parallelism splits them: (hidden, ffn) of Llama-3.2-1B, Llama-3-8B and
# Llama-3-70B, each column-parallel (k -> n/tp) and row-parallel (k/tp -> n) at tp 1-8, for two micro-batch sizes:
# how a matmul's rate falls as tp makes it smaller (the planner's tp time term).
PROJECTION_WIDTHS = [(2048, 8192), (4096, 14336), (8192, 28672)]
PROJECTION_TOKENS = [2048, 8192]
TP_DEGREES = [1, 2, 4, 8]
FP8_SHAPES = [(8192, 2048, 8192), (8192, 4096, 4096), (16384, 4096, 14336), (16384, 14336, 4096), (8192, 8192, 8192)]
# buffer sizes of the collectives timed: the small ones are what tp's per-block all-reduces send (b·L·h values of a
# micro-batch: 0.25-4 MiB for 1-8k tokens at width 128-2048 in bf16), where a collective's latency outweighs its
# bandwidth; the large ones are data parallelism's buckets
GPU_COLLECTIVE_MIB = [0.25, 1, 4, 16, 256]
CPU_COLLECTIVE_MIB = [0.25, 1, 16]
MAX_CALL_S = 0.25  # a shape whose product would take longer than this at the rate just measured is not timed


def _timer(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def median_seconds(fn: Callable[[], Any], device: torch.device, repeats: int = 10, warmup: int = 3) -> float:
    """Median wall time of ``fn`` with the device drained before and after each call."""
    sync = _timer(device)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_rates(
    device: torch.device, shapes: list[tuple[int, int, int]], max_call_s: float = MAX_CALL_S
) -> list[dict[str, Any]]:
    """TFLOP/s per dtype and shape, smallest shape first. A larger shape that the rate just measured says would take
    over ``max_call_s`` per product is left out: on a CPU without AVX-512, bf16 runs a reference kernel ~160x slower
    than fp32, and 13 timed products of 1024^3 would take half a minute to say what the small shape said already."""
    out = []
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # training in fp32 means fp32 here (bigtrain leaves TF32 off)
    try:
        for name, dtype in DTYPES.items():
            if device.type == "cpu" and dtype == torch.float16:
                continue  # no fast fp16 path on CPUs; bf16 is what a CPU run would use
            rate = None
            for m, k, n in sorted(shapes, key=lambda shape: shape[0] * shape[1] * shape[2]):
                flops = 2 * m * k * n
                if rate is not None and flops / rate > max_call_s:
                    break
                # random data (products of zeros run faster than real ones)
                a = torch.randn(m, k, device=device, dtype=dtype)
                b = torch.randn(k, n, device=device, dtype=dtype)
                rate = flops / median_seconds(lambda a=a, b=b: torch.mm(a, b), device)
                out.append({"dtype": name, "m": m, "k": k, "n": n, "tflops": rate / 1e12})
                del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


def projection_shapes() -> list[tuple[int, int, int]]:
    """(m, k, n) of the column- and row-parallel projections of PROJECTION_WIDTHS at every tp degree."""
    shapes = set()
    for hidden, ffn in PROJECTION_WIDTHS:
        for tp in TP_DEGREES:
            for m in PROJECTION_TOKENS:
                shapes |= {
                    (m, hidden, hidden // tp),
                    (m, hidden // tp, hidden),
                    (m, hidden, ffn // tp),
                    (m, ffn // tp, hidden),
                }
    return sorted(shapes)


def projection_rates(device: torch.device) -> list[dict[str, Any]]:
    """bf16 TFLOP/s of every projection shape (``projection_shapes``)."""
    out = []
    for m, k, n in projection_shapes():
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        seconds = median_seconds(lambda a=a, b=b: torch.mm(a, b), device)
        out.append({"dtype": "bf16", "m": m, "k": k, "n": n, "tflops": 2 * m * k * n / seconds / 1e12})
    return out


def fp8_rates(device: torch.device) -> list[dict[str, Any]]:
    """TFLOP/s of ``torch._scaled_mm`` in float8 e4m3 with bf16 output, one scale per tensor and one per row (the
    products float8 training runs), on GPUs with FP8 tensor cores (compute capability 8.9 or later); else nothing."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        return []
    out = []
    for m, k, n in FP8_SHAPES:
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        scales = {
            "tensorwise": (torch.ones((), device=device), torch.ones((), device=device)),
            "rowwise": (torch.ones(m, 1, device=device), torch.ones(1, n, device=device)),
        }
        for recipe, (sa, sb) in scales.items():

            def product(a=a, b=b, sa=sa, sb=sb):
                return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

            seconds = median_seconds(product, device)
            out.append(
                {"dtype": "fp8", "scaling": recipe, "m": m, "k": k, "n": n, "tflops": 2 * m * k * n / seconds / 1e12}
            )
    return out


def op_overhead(device: torch.device, ops: int = 200) -> float:
    """Seconds per operator when the operator does nearly nothing: launch plus eager dispatch."""
    x = torch.zeros(8, device=device)

    def run() -> None:
        for _ in range(ops):
            x.add_(1.0)

    return median_seconds(run, device) / ops


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """GB/s of a device-to-device copy, counting the bytes read and the bytes written."""
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), device)
    return 2 * nbytes / seconds / 1e9


# torch 2.13 renamed these two (older releases have only the old names)
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def collective_bandwidth(device: torch.device, sizes_mib: list[int]) -> list[dict[str, Any]]:
    """Bus bandwidth (GB/s) of all-gather, reduce-scatter and all-reduce over the default group, per buffer size."""
    n = dist.get_world_size()
    out = []
    for mib in sizes_mib:
        numel = int(mib * 2**20) // 4 // n * n  # fp32, divisible by the group
        full = torch.randn(numel, device=device)
        shard = torch.empty(numel // n, device=device)
        ops = {
            "all_gather": (lambda f=full, s=shard: _all_gather(f, s), (n - 1) / n),
            "reduce_scatter": (lambda f=full, s=shard: _reduce_scatter(s, f), (n - 1) / n),
            "all_reduce": (lambda f=full: dist.all_reduce(f), 2 * (n - 1) / n),
        }
        for op, (fn, factor) in ops.items():
            seconds = median_seconds(fn, device, repeats=5, warmup=2)
            out.append(
                {
                    "op": op,
                    "ranks": n,
                    "mib": mib,
                    "seconds": seconds,
                    "bus_gbps": full.numel() * 4 * factor / seconds / 1e9,
                }
            )
    return out


def probe(device: torch.device, tp_overhead: dict[str, float] | None = None) -> dict[str, Any]:
    """The profile of this rank's device, and of the default group's links when there are several ranks;
    ``tp_overhead``: ``probe_tp.tp_block_overhead``'s figures, measured before the group was joined."""
    cuda = device.type == "cuda"
    profile: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "matmul": matmul_rates(device, GPU_SHAPES if cuda else CPU_SHAPES),
        "copy_gbps": copy_bandwidth(device, 2 * 2**30 if cuda else 256 * 2**20),
        "op_overhead_s": op_overhead(device),
        "decode_step_s": decode_overhead(device),
    }
    if cuda:
        profile["memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
        profile["projections"] = projection_rates(device)
        profile["fp8_matmul"] = fp8_rates(device)
    if tp_overhead is not None:
        profile["tp_block_overhead_s"] = tp_overhead
    if dist.is_initialized() and dist.get_world_size() > 1:
        profile["collectives"] = collective_bandwidth(device, GPU_COLLECTIVE_MIB if cuda else CPU_COLLECTIVE_MIB)
        profile["backend"] = dist.get_backend()
    return profile


def run_probe(output: Path | None) -> dict[str, Any]:
    """One rank of ``bigtrain probe``: join the launcher's group when there is one, measure, rank 0 writes."""
    from bigtrain.measure.probe_tp import tp_block_overhead
    from bigtrain.runtime import init_process_group, pick_device, read_launch_env

    env = read_launch_env()
    device = pick_device(env)
    tp_overhead = tp_block_overhead(device)  # on a fake group of its own, before joining the real one
    if env.launched:
        init_process_group(env, device, timeout_s=600)
    try:
        profile = probe(device, tp_overhead)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if env.rank == 0 and output is not None:
        output.write_text(json.dumps(profile, indent=1) + "\n")
    return profile


def summary(profile: dict[str, Any]) -> str:
    """The profile as a table a person reads (the JSON is what the planner reads)."""
    rows = [
        (f"matmul {m['dtype']} {m['m']}x{m['k']}x{m['n']}", f"{m['tflops']:.3f} TFLOP/s") for m in profile["matmul"]
    ]
    rows.append(("host copy", f"{profile['copy_gbps']:.1f} GB/s"))
    rows += [
        (f"{c['op']} over {c['ranks']} ranks, {c['mib']} MiB", f"{c['bus_gbps']:.2f} GB/s (bus)")
        for c in profile.get("collectives", [])
    ]
    decode = profile.get("decode_step_s")
    if decode:
        fixed, per_block = decode["fixed"] * 1e3, decode["per_block"] * 1e3
        rows.append(("generate, host per token", f"{fixed:.2f} + {per_block:.2f}/block ms"))
    for kind, seconds in (profile.get("tp_block_overhead_s") or {}).items():
        rows.append((f"tp block overhead, {kind.replace('_', ' ')}", f"{seconds * 1e3:.2f} ms"))
    width = max(len(label) for label, _ in rows)
    head = [f"{profile['device']} (torch {profile['torch']})", ""]
    return "\n".join(head + [f"{label:{width}s}   {value:>18s}" for label, value in rows])
