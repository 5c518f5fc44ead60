"""A toy capability, as a new engineer would add one (tests/integration/test_a_capability_is_one_file.py copies this
file into a copy of the package and adds its one line to ``RECORDS``): every device holds a scratch buffer of
``parallel.toy_buffer_mib`` MiB for the whole run.

It brings a recipe key, a row of what runs together, a search variant, a model transform, a memory term and an export
note, and nothing else of bigtrain is edited to add it."""

from __future__ import annotations

import contextlib
from typing import Any

from bigtrain.config.capabilities.table import Capability, ModelStep, Option, Plan, SearchSpace, row
from bigtrain.config.setup import Setup

MIB = 2**20
TOY = Option("toy_buffer_mib", 0, "MiB of scratch memory every device holds for the run (a test's toy).", example=8)


def toy_buffer_with_pp(s: Setup) -> str | None:
    if TOY.of(s.plan) and s.plan.pp > 1:
        return f"parallel.toy_buffer_mib={TOY.of(s.plan)} with parallel.pp={s.plan.pp} is not built; use pp=1"
    return None


def _with_buffer(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    if space.pinned(TOY.name):
        return [p.with_option(TOY.name, space.fixed[TOY.name]) for p in plans]
    return plans + [p.with_option(TOY.name, TOY.example) for p in plans]


def _hold(built: Any, ctx: Any) -> None:
    import torch

    with ctx.options.fake_mode or contextlib.nullcontext():  # the simulator allocates on fake tensors
        buffer = torch.empty(TOY.of(built.plan) * MIB, dtype=torch.uint8, device=ctx.options.device)
    built.extra_tensors.append(buffer)  # alive as long as the model: the engines hold it
    print(f"toy_buffer: holding {buffer.numel() // MIB} MiB", flush=True)


CAPABILITY = Capability(
    name="toy_buffer",
    summary="toy buffer: every device holds a scratch buffer for the run",
    options=(TOY,),
    rules=(row(toy_buffer_with_pp, "not_built"),),
    variants=_with_buffer,
    steps=(ModelStep("toy_buffer", after="load_values", wanted=lambda o: TOY.of(o.plan) > 0, apply=_hold),),
    memory=lambda stats, plan, workload: TOY.of(plan) * MIB,
    export_note=lambda target, plan: f"{target} holds no toy buffer; dropped" if TOY.of(plan) else None,
)
