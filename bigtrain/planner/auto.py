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
from bigtrain.planner.classifier_plan import candidates as classifier_candidates
from bigtrain.planner.classifier_plan import estimate_memory as classifier_memory
from bigtrain.planner.classifier_plan import estimate_time as classifier_time
from bigtrain.planner.classifier_plan import table_lines
from bigtrain.planner.classifier_stats import ClassifierStats, is_classifier, measure_classifier
from bigtrain.planner.cost import estimate_time
from bigtrain.planner.explain import render_table
from bigtrain.planner.hardware import GPU, Cluster, GiB, lookup_gpu
from bigtrain.planner.memory import estimate_memory
from bigtrain.planner.model_stats import ModelStats
from bigtrain.planner.profile import gpu_from_profile
from bigtrain.planner.search import search

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
    model_config: dict[str, Any],
    world_size: int,
    ranks_per_node: int,
    device_name: str | None,
    free_bytes: int,
    workload: Workload,
    profile: dict[str, Any] | None = None,
    fixed: dict[str, Any] | None = None,
    host_memory_bytes: int | None = None,
) -> Choice:
    """The best plan (and method, for ``train.method: auto``) and the table explaining it; ConfigError with the
    reason when none fits. ``workload`` carries the train options that decide what may run (``train.compile``,
    ``train.method``); ``profile``: a ``bigtrain probe`` profile whose measured rates replace the table's
    (``profile.py``); ``fixed``: plan fields the recipe states (``train.method: auto`` with a written plan);
    ``host_memory_bytes``: free host memory of a node, for offloaded state (None: the planner's assumption)."""
    cluster = local_cluster(world_size, ranks_per_node, device_name, free_bytes, profile, host_memory_bytes)
    if is_classifier(model_config):
        return _choose_classifier_plan(model_config, cluster, workload, fixed)
    stats = ModelStats.from_config(model_config)
    gpu = cluster.gpu
    candidates = search(stats, cluster, workload, fixed, predict_unrunnable=False)
    table = render_table(candidates, stats, cluster, workload)
    best = candidates[0]  # the search ranks the plans the trainer can run first
    if not (best.fits and best.runnable):
        raise ConfigError(
            f"parallel.plan=auto found no plan the trainer can run on {world_size} x {gpu.name}: best was "
            f"'{best.rejected_because}'; use more devices, a smaller train.global_batch_size or data.seq_len"
        )
    return Choice(best.plan, best.method, best.compile, best.fp8, table)


def _choose_classifier_plan(
    model_config: dict[str, Any], cluster: Cluster, workload: Workload, fixed: dict[str, Any] | None
) -> Choice:
    """An image or sequence classifier's plan (``classifier_plan.py``): full training, eager, no FP8."""
    stats = _classifier_stats(model_config, workload)
    found = classifier_candidates(stats, cluster, workload, fixed or {})
    best = found[0]
    if not best.fits:
        raise ConfigError(
            f"parallel.plan=auto found no plan that fits {cluster.num_gpus} x {cluster.gpu.name}: the smallest needs "
            f"{best.memory.budget_bytes / GiB:.1f} GiB per device; use more devices, a smaller "
            "train.global_batch_size or data.image_size"
        )
    return Choice(best.plan, "full", False, "none", "\n".join(table_lines(found, workload, stats.unit)))


def _classifier_stats(model_config: dict[str, Any], workload: Workload) -> ClassifierStats:
    image = workload.image_size
    return measure_classifier(model_config, image, 0 if image else workload.seq_len, workload.mixed_precision)


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


def predict(model_config: dict[str, Any], plan: Plan, cluster: Cluster, workload: Workload) -> str:
    """The planner's prediction for the plan start-up runs (written or chosen), in the plan line's words: its peak
    per device, and on GPUs its step time (the time model has no numbers for CPU processes)."""
    on_gpus = cluster.gpu.name != CPU.name
    if is_classifier(model_config):
        classifier = _classifier_stats(model_config, workload)
        peak = classifier_memory(classifier, plan, workload).total_bytes
        per_s = classifier_time(classifier, plan, cluster, workload).per_s if on_gpus else 0.0
        speed = f"{per_s:,.0f} {classifier.unit}/s"
    else:
        stats = ModelStats.from_config(model_config)
        peak = estimate_memory(stats, plan, workload).total_bytes
        step_s = estimate_time(stats, plan, cluster, workload).step_s if on_gpus else 0.0
        speed = f"{step_s:.3f} s per step"
    words = f"predicted peak {peak / GiB:.2f} GiB per device"
    return f"{words}, {speed}" if on_gpus else words
