"""A hardware profile written by ``bigtrain probe`` as the planner's GPU: measured rates instead of the datasheet's.

What the profile replaces in the time model (``cost.py``):
- compute: the matmul rate measured for the run's dtype at the measured shape whose token count (m) is nearest the
  micro-batch's (on a log scale), taken as achieved; it stands in for peak x ACHIEVABLE x the small-micro-batch
  saturation x the fp32 slowdown, which are all assumptions;
- links: the median bus bandwidth of the largest all-gather, reduce-scatter and all-reduce the probe timed, for
  groups within a node (the ring model's bandwidth is exactly nccl-tests' bus bandwidth); between nodes the table's
  figure is kept, since one machine cannot measure it;
- memory: the device memory the probe read (a CUDA device's total), unless ``--gpu-memory`` says otherwise;
- memory bandwidth: the element-wise work, the loss and the optimizer step are timed at the measured copy rate;
- overlap: a CPU profile's collectives run on the cores that compute (gloo), so none of their time is hidden;
- the per-operator floor: the measured seconds of one tiny operator (launch and dispatch);
- tensor parallelism (``tp_time.py``): the rates of the projections at the shapes tp cuts them into, the DTensor
  machinery's seconds per block, and the links' latency: what the smallest all-reduces took beyond their bytes.
MFU stays relative to the datasheet peak of the GPU named (or to the fastest measured rate for devices the table
does not know, e.g. a CPU).
Pure Python: the profile is JSON, read here without torch.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from bigtrain.errors import ConfigError
from bigtrain.planner.hardware import GPU


def load_profile(path: str | Path) -> dict[str, Any]:
    """The profile's JSON, checked for what the planner reads; ConfigError naming the flag otherwise."""
    name = f"--hardware-profile {str(path)!r}"
    try:
        profile = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{name} does not exist; write one with bigtrain probe -o FILE [--nproc N]") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{name} is not JSON ({e.msg} at line {e.lineno}); write it with bigtrain probe") from e
    rows = profile.get("matmul") if isinstance(profile, dict) else None
    if not rows or not all({"dtype", "m", "tflops"} <= set(r) and r["tflops"] > 0 for r in rows):
        raise ConfigError(f"{name} has no matmul rates (a list of dtype, m, tflops); write it with bigtrain probe")
    return profile


def matmul_rates(profile: dict[str, Any]) -> tuple[tuple[str, int, float], ...]:
    """(dtype, m, TFLOP/s) of every measured product; the float8 ones as ``fp8-tensorwise`` / ``fp8-rowwise``."""
    rows = [(str(r["dtype"]), int(r["m"]), float(r["tflops"])) for r in profile["matmul"]]
    rows += [(f"fp8-{r['scaling']}", int(r["m"]), float(r["tflops"])) for r in profile.get("fp8_matmul", [])]
    return tuple(rows)


def link_gbps(profile: dict[str, Any]) -> float | None:
    """Median bus bandwidth (GB/s) of the largest collectives measured, or None without collectives."""
    rows = [c for c in profile.get("collectives", []) if c.get("bus_gbps", 0) > 0]
    if not rows:
        return None
    largest = max(c["mib"] for c in rows)
    return statistics.median(c["bus_gbps"] for c in rows if c["mib"] == largest)


def link_latency_s(profile: dict[str, Any]) -> float | None:
    """Seconds of a collective's fixed cost: for each smaller all-reduce measured, its seconds less its bus bytes at
    the bus bandwidth of the largest all-reduce; the least of them (noise only adds time). None without two sizes."""
    rows = [c for c in profile.get("collectives", []) if c["op"] == "all_reduce" and c.get("seconds", 0) > 0]
    if len({c["mib"] for c in rows}) < 2:
        return None
    largest = max(c["mib"] for c in rows)
    bandwidth = statistics.median(c["bus_gbps"] for c in rows if c["mib"] == largest) * 1e9
    n = rows[0]["ranks"]
    fixed = [c["seconds"] - c["mib"] * 2**20 * 2 * (n - 1) / n / bandwidth for c in rows if c["mib"] < largest]
    return max(0.0, min(fixed))


def gpu_from_profile(profile: dict[str, Any], base: GPU, memory_bytes: int | None = None) -> GPU:
    """``base`` (the table's GPU of that name, or a stand-in) with the profile's measured rates, link and memory."""
    rates = matmul_rates(profile)
    link = link_gbps(profile)
    latency = link_latency_s(profile)
    overhead = profile.get("tp_block_overhead_s")
    decode = profile.get("decode_step_s")
    known_peak = base.peak_tflops if base.name in str(profile.get("device", "")).upper() else 0.0
    return replace(
        base,
        name=str(profile.get("device", base.name)),
        memory_bytes=memory_bytes or int(profile.get("memory_bytes") or base.memory_bytes),
        peak_tflops=known_peak or max(t for _, _, t in rates),
        intra_node_gbps=link if link is not None else base.intra_node_gbps,
        measured_tflops=rates,
        copy_gbps=float(profile.get("copy_gbps") or 0.0),
        overlaps_comm=not str(profile.get("device", "")).lower().startswith("cpu"),
        op_overhead_s=float(profile.get("op_overhead_s") or base.op_overhead_s),
        link_latency_s=latency if latency is not None else base.link_latency_s,
        projection_tflops=tuple(
            (int(r["m"]), int(r["k"]), int(r["n"]), float(r["tflops"])) for r in profile.get("projections", [])
        ),
        tp_block_overhead_s=(float(overhead["plain"]), float(overhead["sequence_parallel"])) if overhead else None,
        decode_step_s=(float(decode["fixed"]), float(decode["per_block"])) if decode else None,
    )


def measured_rate(gpu: GPU, dtype: str, tokens: int) -> float | None:
    """TFLOP/s the profile measured for ``dtype`` at the shape nearest ``tokens`` rows, or None without one."""
    row = measured_row(gpu, dtype, tokens)
    return row[1] if row else None


def measured_row(gpu: GPU, dtype: str, tokens: int) -> tuple[int, float] | None:
    """(rows m, TFLOP/s) of the profile's ``dtype`` measurement nearest ``tokens`` rows, or None without one."""
    rows = [(m, t) for d, m, t in gpu.measured_tflops if d == dtype]
    if not rows:
        return None
    return min(rows, key=lambda row: abs(math.log(row[0] / max(tokens, 1))))
