"""``parallel.plan: auto``: the planner's choice among the plans the trainer can run, for the hardware it runs on.

Pure Python; the trainer supplies the facts (world size, ranks per node, device name, the smallest free memory of
any rank), so every rank computes the same plan from the same numbers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.planner.hardware import GPU, Cluster, lookup_gpu, size
from bigtrain.planner.planned import PlannedModel, planned
from bigtrain.planner.profile import gpu_from_profile

# A CPU "device" for runs without GPUs: host memory is the budget; the speed numbers only order the candidates.
# gloo runs on the cores that compute (nothing overlaps), and tp's per-block machinery and a collective's latency
# are what bigtrain probe measured on the 2-core CI machine (bench/results/cpu_probe_tp.json: 6.7 / 8.2 ms, 0.27 ms).
CPU = GPU(
    "CPU", 0, peak_tflops=0.5, intra_node_gbps=10.0, inter_node_gbps=1.25, pcie_gbps=10.0, overlaps_comm=False,
    link_latency_s=2.7e-4, tp_block_overhead_s=(6.7e-3, 8.2e-3),
)


class Choice(NamedTuple):
    plan: Plan
    method: str  # train.method as chosen (full, lora, qlora): the workload's own unless it is auto
    compile: bool | str  # train.compile as chosen (the workload's own unless it is auto)
    fp8: str  # train.fp8 as chosen (the workload's own unless it is auto)
    table: str  # the explanation (planner/explain.py)


def choose_plan(
    model: PlannedModel,
    world_size: int,
    ranks_per_node: int,
    device_name: str | None,
    free_bytes: int,
    workload: Workload,
    profile: dict[str, Any] | None = None,
    fixed: dict[str, Any] | None = None,
    host_memory_bytes: int | None = None,
) -> Choice:
    """The best plan (and method, for ``train.method: auto``) for the job's model (``TaskSpec.planner``) and the
    table explaining it; ConfigError with the reason when none fits. ``workload`` carries the train options that
    decide what may run (``train.compile``, ``train.method``); ``profile``: a ``bigtrain probe`` profile whose
    measured rates replace the table's (``profile.py``); ``fixed``: plan fields the recipe states (``train.method:
    auto`` with a written plan); ``host_memory_bytes``: free host memory of a node, for offloaded state (None: the
    planner's assumption)."""
    from bigtrain.planner.explain import render_table
    from bigtrain.planner.search import search

    cluster = local_cluster(world_size, ranks_per_node, device_name, free_bytes, profile, host_memory_bytes)
    gpu = cluster.gpu
    candidates = search(model, cluster, workload, fixed, predict_unrunnable=False)
    table = render_table(candidates, model, cluster, workload)
    best = candidates[0]  # the search ranks the plans the trainer can run first
    if not (best.fits and best.runnable):
        raise ConfigError(
            f"parallel.plan=auto found no plan the trainer can run on {world_size} x {gpu.name}: best was "
            f"'{best.rejected_because}'; use more devices, a smaller train.global_batch_size or data.seq_len"
        )
    return Choice(best.plan, best.method, best.compile, best.fp8, table)


def local_cluster(
    world_size: int,
    ranks_per_node: int,
    device_name: str | None,
    free_bytes: int,
    profile: dict[str, Any] | None = None,
    host_memory_bytes: int | None = None,
) -> Cluster:
    """The job's own devices as the planner sees them: the named GPU (H100's speeds for one the table lacks) with
    the memory measured free, or CPU processes (``device_name`` None)."""
    if device_name is None:
        gpu = CPU
    else:
        try:
            gpu = lookup_gpu(device_name)
        except ConfigError:  # an unknown GPU: plan with H100 speeds; the memory below is measured anyway
            gpu = replace(lookup_gpu("H100"), name=device_name)
    gpu = replace(gpu, memory_bytes=free_bytes)
    if profile is not None:
        gpu = gpu_from_profile(profile, gpu, memory_bytes=free_bytes)
    # host memory for offloaded state: none on a CPU "device", where offload moves nothing off it
    host = host_memory_bytes if device_name is not None else 0
    return Cluster(gpu, world_size, max(1, min(ranks_per_node, world_size)), host_memory_bytes=host)


def predict(model: PlannedModel, plan: Plan, cluster: Cluster, workload: Workload) -> str:
    """The planner's prediction for the plan start-up runs (written or chosen), in the plan line's words: its peak
    per device, and on GPUs its step time (the time model has no numbers for CPU processes)."""
    model = planned(model)
    peak = model.estimate_memory(plan, workload).total_bytes
    words = f"predicted peak {size(peak, digits=2)} per device"  # a tiny run reads in MiB, not "0.00 GiB"
    if cluster.gpu.name == CPU.name:
        return words
    step_s = model.estimate_time(plan, cluster, workload).step_s
    return f"{words}, {step_s:.3f} s per step"
