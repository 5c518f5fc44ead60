"""When nothing fits: which of the ways out (adapters, offload, a shorter sequence, more GPUs) would."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bigtrain.api.request import PlanRequest
from bigtrain.errors import ConfigError
from bigtrain.planner.hardware import size
from bigtrain.planner.search import Candidate, search


def _search(req: PlanRequest, **changes: Any) -> list[Candidate]:
    """The search for ``req`` with some of its parts changed (``cluster``, ``fixed``, or the workload's fields)."""
    workload_fields = {k: changes.pop(k) for k in ("seq_len", "global_batch_size") if k in changes}
    r = replace(req, workload=replace(req.workload, **workload_fields), **changes)
    return search(r.model, r.cluster, r.workload, r.fixed, predict_unrunnable=False)


def _fits(candidates: list[Candidate]) -> bool:
    """Whether the best candidate is a plan the trainer can run and that fits (the search ranks those first)."""
    return candidates[0].fits and candidates[0].runnable


def alternatives_that_fit(req: PlanRequest) -> dict[str, str]:
    """Try the ways out the search does not take by itself and say which would fit, best predicted step first:
    adapters instead of full fine-tuning (LoRA, QLoRA's 4-bit base), offload the recipe pinned off, a shorter
    sequence (each by its best plan's predicted step, fastest first), then more GPUs. More GPUs come as nodes of 8
    when the request's nodes are smaller than that (a lone GPU's "node" says nothing about the nodes it would join),
    which is what lets context parallelism split long rows over them. (Checkpointing, offload and context
    parallelism on these GPUs are the search's own choices: had one of them fitted, the search would have found it.)"""
    found: list[tuple[float, str, str]] = []
    if req.workload.method == "full":
        for method in ("lora", "qlora"):
            workload = replace(req.workload, method=method)
            if method == "qlora":
                workload = replace(workload, mixed_precision="bf16")  # QLoRA computes in bf16 over its NF4 base
            try:
                candidates = search(req.model, req.cluster, workload, req.fixed, predict_unrunnable=False)
            except ConfigError:  # the table refuses the method outright here
                continue
            if _fits(candidates):
                best = candidates[0]
                found.append(
                    (
                        best.time.step_s,
                        method,
                        f"{method} adapters ({req.spell.value('method', method)}: {size(best.memory.total_bytes)} "
                        f"peak per GPU, {best.time.step_s:.3f} s per step)",
                    )
                )
    # offloading needs a sharded backend, and is only a way out if the user has not pinned it already
    if req.fixed.get("backend") != "ddp":
        for key in ("offload_params", "offload_optimizer"):
            if key in req.fixed:
                continue
            try:
                candidates = _search(req, fixed={**req.fixed, key: True})
            except ConfigError:  # no plan of that kind meets the pins
                continue
            if _fits(candidates):
                pin = f"--fix {key}=true" if req.spell.cli else f"fix={{'{key}': True}}"
                found.append((candidates[0].time.step_s, "offload", f"offload ({pin})"))
                break
    for div in (2, 4, 8, 16):
        seq = req.workload.seq_len // div
        if seq >= 2:
            candidates = _search(req, seq_len=seq)
            if _fits(candidates):
                sentence = f"a shorter sequence ({req.spell.value('seq_len', seq)})"
                found.append((candidates[0].time.step_s, "seq", sentence))
                break
    for factor in (2, 4, 8, 16, 32, 64):
        gpus = req.cluster.num_gpus * factor
        batch = max(req.workload.global_batch_size, gpus) // gpus * gpus
        per_node = max(req.cluster.gpus_per_node, min(gpus, 8))
        more = replace(req.cluster, num_gpus=gpus, gpus_per_node=per_node)
        candidates = _search(req, cluster=more, global_batch_size=batch)
        if _fits(candidates):
            best = candidates[0].plan
            pin = f"--fix cp={best.cp}" if req.spell.cli else f"fix={{'cp': {best.cp}}}"
            how = f": each row split over {best.cp} of them, {pin}" if best.cp > 1 else ""
            found.append((candidates[0].time.step_s, "gpus", f"{gpus} GPUs ({req.spell.value('gpus', gpus)}{how})"))
            break
    # what these GPUs can do first, fastest first; more GPUs last
    return {key: sentence for _, key, sentence in sorted(found, key=lambda f: (f[1] == "gpus", f[0]))}
