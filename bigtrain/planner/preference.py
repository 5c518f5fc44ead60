"""What an objective with rows of its own per example changes in a plan's memory and time: a preference pair is two
rows (its chosen and its rejected answer after one prompt), so a plan of P pairs per step in micro-batches of m pairs
computes as a causal-LM plan of 2P rows in micro-batches of 2m (``as_rows``), which every memory and time term
already models. What its roles add (the reference model) are their records' terms (``config/capabilities``)."""

from __future__ import annotations

import dataclasses

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload


def as_rows(plan: Plan, workload: Workload) -> tuple[Plan, Workload]:
    """The plan and workload of rows a job of several rows per example computes as; others unchanged."""
    per = workload.job.rows_per_example
    if per == 1:
        return plan, workload
    job = dataclasses.replace(workload.job, rows_per_example=1, roles=())
    rows = dataclasses.replace(workload, global_batch_size=per * workload.global_batch_size, job=job)
    return plan.but(micro_batch_size=per * plan.micro_batch_size), rows


def batch_words(workload: Workload) -> str:
    """The global batch as the table's header says it: pairs of rows where an example is several rows."""
    per = workload.job.rows_per_example
    if per == 1:
        return str(workload.global_batch_size)
    return f"{workload.global_batch_size} pairs ({per * workload.global_batch_size} rows)"
