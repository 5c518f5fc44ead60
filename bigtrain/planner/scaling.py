"""The scaling view of a plan: its kind on 1, 2, 4, ... up to the asked GPUs (each GPU with the same share of the
global batch: the chosen micro-batch and accumulation), throughput, speed-up and efficiency over the smallest count,
and what communication the step no longer hides. Any task's plan can be viewed so (``PlanResult.scaling``); a model
trained by data parallelism alone (a classifier) shows it with its plan table, the measure data-parallel training is
judged by.

What it leaves out, said under its table: the input pipeline (decoding and augmenting images on the host, which
caps images/s per GPU where the host's cores are too few), stragglers and jitter (a step waits for the slowest rank,
which grows with the count), and the network's contention beyond the links' rated bandwidth.
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.hardware import Cluster
from bigtrain.planner.planned import PlannedModel

WAITING = 0.9  # efficiency under which the view says the GPUs wait on communication
LEFT_OUT = (
    "not modelled: the input pipeline (decoding and augmenting on the host), stragglers and jitter (each step waits "
    "for the slowest rank), network contention beyond the links' rated bandwidth"
)


@dataclass(frozen=True)
class ScalingRow:
    gpus: int
    per_s: float  # throughput of the whole job, in the task's unit (tokens, images, examples) per second
    speedup: float  # over the smallest count
    efficiency: float  # speed-up per GPU added, 1.0 = linear
    exposed_s: float  # communication per step that compute does not hide
    fits: bool  # the plan's memory fits one GPU at this count


def counts(smallest: int, largest: int) -> list[int]:
    """``smallest``, twice it, four times it, ... and ``largest``."""
    out, g = [], smallest
    while g < largest:
        out.append(g)
        g *= 2
    return out + [largest]


def scaling(model: PlannedModel, chosen: Plan, cluster: Cluster, workload: Workload) -> list[ScalingRow]:
    """``chosen``'s kind on more and more GPUs of the cluster's kind: its data-parallel degree grows (tp, pp and cp
    kept, the smallest count their product), each GPU's share of the batch the chosen one's."""
    group = chosen.tp * chosen.pp * chosen.cp
    per_group = workload.global_batch_size // chosen.dp
    rows: list[ScalingRow] = []
    for g in counts(group, cluster.num_gpus):
        if g % group:
            continue
        dp = g // group
        c = Cluster(cluster.gpu, g, min(cluster.gpus_per_node, g), cluster.host_memory_bytes, cluster.replica_link)
        w = dataclasses.replace(workload, global_batch_size=per_group * dp)
        ddp = chosen.backend == "ddp"
        plan = chosen.but(dp_replicate=dp if ddp else 1, dp_shard=1 if ddp else dp)
        t = model.estimate_time(plan, c, w)
        per_s = t.tokens_per_s_per_device * g
        fits = model.estimate_memory(plan, w).budget_bytes <= cluster.gpu.memory_bytes
        first = rows[0] if rows else None
        speedup = per_s / first.per_s if first else 1.0
        rows.append(ScalingRow(g, per_s, speedup, speedup / (g / (first.gpus if first else g)), t.comm_s, fits))
    return rows


def scaling_lines(rows: list[ScalingRow], unit: str, per_gpu: int) -> list[str]:
    """The view as the plan table prints it."""
    lines = [
        f"scaling of this plan, {per_gpu} {unit} per GPU per step ({rows[0].gpus} GPU to {rows[-1].gpus}):",
        f"  {'GPUs':>4}  {unit + '/s':>12}  {'speed-up':>8}  {'efficiency':>10}  {'comm not hidden':>15}",
    ]
    for r in rows:
        lines.append(
            f"  {r.gpus:>4}  {r.per_s:>12,.0f}  {r.speedup:>7.2f}x  {r.efficiency:>10.0%}  "
            f"{r.exposed_s * 1e3:>12.1f} ms{'' if r.fits else '  (does not fit)'}"
        )
    waiting = [r for r in rows if r.efficiency < WAITING]
    if waiting:
        lines.append(
            f"  from {waiting[0].gpus} GPUs on, below {WAITING:.0%} efficiency: communication outlasts what compute "
            "hides and the GPUs wait"
        )
    lines.append(textwrap.fill(LEFT_OUT, 118, initial_indent="  ", subsequent_indent="    "))
    return lines
