"""``bigtrain plan ... --losses 1,8``: what losing GPUs costs before it happens. For each count lost, the plan an
elastic run would re-plan to on the GPUs that remain (the same global batch, method and objective; ``--elastic``,
docs/elastic.md), its peak per GPU and step time, and the throughput against all the GPUs."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

from bigtrain.errors import ConfigError


def parse_losses(text: str, gpus: int) -> list[int]:
    """``1,8`` as [1, 8]: each a count of GPUs lost, fewer than the ``gpus`` planned for."""
    try:
        losses = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        losses = []
    if not losses or any(n < 1 for n in losses):
        raise ConfigError(f"--losses={text!r} is not a list of GPU counts lost, e.g. --losses 1,8")
    too_many = [n for n in losses if n >= gpus]
    if too_many:
        raise ConfigError(f"--losses={text!r}: losing {too_many[0]} of {gpus} GPUs leaves none; lose fewer")
    return sorted(set(losses))


def after_losses(text: str, full: Any, plan: Callable[..., Any]) -> str:
    """``--losses``' table: ``plan(**changed)`` is the command's planning with some of its arguments changed."""
    lost = parse_losses(text, full.cluster.num_gpus)
    # the same global batch on fewer GPUs (a count left unset would follow the GPUs: 512 on 8, 511 on 7)
    kept, per_node = full.workload.global_batch_size, full.cluster.gpus_per_node
    return losses_table(full, lambda n: plan(gpus=n, gpus_per_node=min(per_node, n), global_batch_size=kept), lost)


def losses_table(full: Any, replan: Callable[[int], Any], losses: list[int]) -> str:
    """The table: the plan on every GPU (``full``), then for each count lost the plan ``replan(gpus)`` finds on the
    GPUs that remain, or, where none runs on them all (a global batch they cannot split), on the most of them that
    one runs on (what the elastic run's stop line tells you to start again with). On several nodes a lost GPU takes
    its node out (torchrun starts the same ranks on every node), so whole nodes remain."""
    gpus, per_node = full.cluster.num_gpus, full.cluster.gpus_per_node
    step = per_node if gpus > per_node else 1
    rows = [("lost", "GPUs left", "used", "plan after the loss", "peak/GPU", "step s", "throughput")]
    rows.append(("0", str(gpus), str(gpus), _name(full), _peak(full), f"{full.time.step_s:.3f}", "(all GPUs)"))
    for lost in losses:
        left = (gpus - lost) // step * step
        label = str(lost) if left == gpus - lost else f"{lost} (with {'its node' if lost == 1 else 'their nodes'})"
        found, why = None, "no GPU left"
        for used in range(left, 0, -step):
            try:
                after = replan(used)
            except ConfigError as e:
                why = why if found else str(e)
                continue
            if after.fits:
                found = after
                break
            why = after.searched[0].rejected_because or after.searched[0].unsupported or "none fits"
        if found is None:
            rows.append((label, str(left), "0", "none", "", "", why))
            continue
        change = full.time.step_s / found.time.step_s - 1  # the same global batch: throughput goes as 1 / step time
        used = found.cluster.num_gpus
        rows.append(
            (label, str(left), str(used), _name(found), _peak(found), f"{found.time.step_s:.3f}", f"{change:+.1%}")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows]
    head = (
        f"after losing GPUs (--losses): re-planned for the GPUs that remain with the global batch kept (what bigtrain "
        f"train --elastic does; 'used' < 'GPUs left': no plan runs on them all, the elastic run stops and names that "
        f"count); throughput against all {gpus} GPUs"
    )
    return "\n".join([*textwrap.wrap(head, 118), *("  " + line.rstrip() for line in lines)])


def _name(result: Any) -> str:
    from bigtrain.planner.names import describe

    return describe(result.plan)


def _peak(result: Any) -> str:
    from bigtrain.planner.hardware import size

    return size(result.memory.total_bytes)
