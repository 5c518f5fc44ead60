"""Render a search result: the table a person reads, the JSON a program reads, and why nothing fits."""

from __future__ import annotations

import re
import textwrap
from dataclasses import replace
from typing import Any

from bigtrain.config.capabilities import CAPABILITIES
from bigtrain.config.capabilities.reference import one_reference_each
from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.workload import Workload
from bigtrain.planner.adapter_memory import adapter_params, trained_params
from bigtrain.planner.hardware import Cluster, GiB, count, size
from bigtrain.planner.model_stats import ModelStats
from bigtrain.planner.names import describe
from bigtrain.planner.planned import PlannedModel, planned
from bigtrain.planner.preference import batch_words
from bigtrain.planner.ranking import NEAR_TIE
from bigtrain.planner.replica_sync_time import WAIT_SHARE
from bigtrain.planner.rollout_time import rollout_note
from bigtrain.planner.search import COMPETITIVE, Candidate
from bigtrain.planner.vision_stats import image_size_of

SHOWN_FITTING = 8
SHOWN_REJECTED = 6
SHOWN_UNRUNNABLE = 8


def candidate_name(c: Candidate) -> str:
    """The plan's name, led by the method when it is not full fine-tuning, with the compile and FP8 it was timed
    for (train.compile / train.fp8 auto)."""
    name = describe(c.plan) if c.method == "full" else f"{c.method} {describe(c.plan)}"
    return name + (" compile" if c.compile is True else "") + (f" fp8={c.fp8}" if c.fp8 != "none" else "")


def _gib(n: int) -> str:
    return f"{n / GiB:.1f}" if n >= GiB // 10 else f"{n / GiB:.3f}"  # a tiny model's peak is not 0.0


def _numbers(c: Candidate) -> str:
    """A row's columns after the plan's name."""
    return (
        f"{_gib(c.memory.total_bytes):>9s} {_gib(c.memory.budget_bytes):>10s} {c.time.step_s:9.3f} "
        f"{c.time.tokens_per_s_per_device:11,.0f} {c.time.mfu:6.1%}"
    )


HEADER = ("plan", "peak GiB", "+margin GiB", "step s", "tok/s/dev", "MFU")
# the throughput column's name by the task's unit (``JobFacts.unit``)
PER_DEVICE = {"tokens": "tok/s/dev", "images": "img/s/dev", "examples": "ex/s/dev", "pairs": "pairs/s/dev"}


def throughput_column(workload: Workload) -> str:
    return PER_DEVICE.get(workload.job.unit, f"{workload.job.unit[:3]}/s/dev")


# the abbreviations of a plan's name (``describe``): what each means, and how to find it in a name
LEGEND: tuple[tuple[str, str, str], ...] = (
    ("zeroN", r"\bzero\d", "sharding stage: fsdp2 zero2 keeps parameters gathered from forward to backward, zero3 "
     "gathers them twice; deepspeed's ZeRO stage 1/2/3"),
    ("dp=N", r"\bdp=\d+\b(?!x)", "data-parallel ranks (each reads different rows)"),
    ("dp=RxS", r"\bdp=\d+x\d+", "hybrid sharding (HSDP): R replicas of S-way sharding"),
    ("tp=N", r"\btp=\d", "tensor parallel: each block's matrices split over N GPUs of a node"),
    ("+lp", r"\+lp", "loss parallel: LM head and loss split over the vocabulary too"),
    ("+sp", r"\+sp", "sequence parallel: norms and residual stream split over the sequence"),
    ("pp=N/sched", r"\bpp=\d+/", "pipeline parallel: N stages, run with that schedule"),
    ("cp=N", r"\bcp=\d", "context parallel: each row's sequence split over N GPUs"),
    ("ep=N", r"\bep=\d", "expert parallel: a mixture's experts split over N GPUs"),
    ("ac=...", r"\bac=", "activation checkpointing: none, selective (per op) or full (per block)"),
    ("ac=full/k", r"\bac=\w+/\d", "checkpointing on every k-th block only"),
    ("mb=N", r"\bmb=\d", "micro-batch: rows per forward on one rank (the rest of the batch is accumulation)"),
    ("rs=micro", r"\brs=micro", "fsdp2 reduce-scatters gradients after every micro-step (sharded between them)"),
    ("rs=step", r"\brs=step", "fsdp2 reduces gradients once per optimizer step (kept whole in between)"),
    ("chunk=N", r"\bchunk=\d", "LM head and loss computed over chunks of N tokens"),
    ("offload=...", r"\boffload=", "parameters, optimizer states or activations (act) kept in host memory"),
    ("reference=...", r"\breference=", "dpo/ipo: where the reference model's log-probabilities come from"),
    ("diloco H=N", r"\b(diloco|local_sgd) H=", "the dp_replicate groups train apart and synchronise every N steps "
     "(DiLoCo's outer Nesterov step, or local SGD's average)"),
    ("F=N/tau=T", r"\bF=\d+/tau=", "streaming: N fragments synchronised at staggered steps, each transfer "
     "overlapping T inner steps"),
)  # fmt: skip
COLUMNS = (
    "peak GiB: predicted peak of tensor memory per GPU; +margin GiB: with the allocator's margin, what must fit; "
    "step s: predicted seconds per optimizer step; tok/s/dev: tokens per second per GPU; MFU: model FLOPs "
    "utilisation"
)


def legend(names: list[str] | None = None) -> list[str]:
    """The legend lines: of the abbreviations used in ``names``, or all of them (``bigtrain plan --legend``)."""
    shown = [(k, text) for k, pattern, text in LEGEND if names is None or any(re.search(pattern, n) for n in names)]
    return [f"  {key:11s} {text}" for key, text in shown]


def why_not(c: Candidate, best: Candidate) -> str | None:
    """Why ``c`` was not chosen over ``best`` (None for the choice itself): slower by how much, a near tie lost to
    the simpler plan, the method preference, over which budget, or what the trainer cannot run."""
    if not c.runnable:
        return f"not runnable yet: {c.unsupported}"
    if not c.fits:
        return c.rejected_because
    if c is best:
        return None
    if c.time.step_s > best.time.step_s * (1 + NEAR_TIE):
        return f"{c.time.step_s / best.time.step_s - 1:.1%} slower"
    if c.method != best.method:  # method: auto prefers full fine-tuning while it is competitive
        return (
            f"{c.method} at {c.time.step_s:.3f} s per step: {best.method} is preferred while its step takes at most "
            f"{COMPETITIVE:g}x an adapter plan's"
        )
    if settings_of(c.plan).semi_synchronous and not settings_of(best.plan).semi_synchronous:
        share = best.time.link_wait_s / best.time.step_s
        return (
            f"synchronises every {settings_of(c.plan).every} steps: chosen only when every-step training waits more "
            f"than {WAIT_SHARE:.0%} of its step on the link between replica groups (the choice waits {share:.1%})"
        )
    if c.plan.offload_activations and not best.plan.offload_activations:
        return "offloads activations: chosen only where no plan without it fits (its copies are not yet measured)"
    faster = 1 - c.time.step_s / best.time.step_s
    if abs(faster) < 0.0005:  # what one decimal of a percent would print as 0.0% (or -0.0%)
        pace = "as fast"
    else:
        pace = f"{faster:.1%} faster" if faster > 0 else f"{-faster:.1%} slower"
    return f"near tie ({pace}, within {NEAR_TIE:.0%}): the choice has fewer moving parts{_simpler(best, c)}"


def _simpler(best: Candidate, c: Candidate) -> str:
    """Where the choice is simpler than ``c``, in a few words (the parts ``complexity`` counts)."""
    a, b = best.plan, c.plan
    parts = []
    if (a.backend, a.zero_stage) != (b.backend, b.zero_stage):
        parts.append(f"{describe(a).split(' dp=')[0]} over {describe(b).split(' dp=')[0]}")
    for key in ("tp", "pp", "cp", "ep"):
        if getattr(a, key) < getattr(b, key):
            parts.append(f"no {key}={getattr(b, key)}")
    if a.dp_replicate < b.dp_replicate and b.backend == "fsdp2":
        parts.append("no replica groups")
    if a.activation_checkpointing != b.activation_checkpointing:
        parts.append(f"ac={a.activation_checkpointing} over ac={b.activation_checkpointing}")
    return f" ({', '.join(parts)})" if parts else ""


def _images(stats: Any, workload: Workload) -> str:
    """A vision-language model's images: how many a row holds, their size, the image tokens of the row, and the
    vision side's parameters (in the model's count)."""
    if getattr(stats, "vision", None) is None:
        return ""
    size = image_size_of(workload)
    tokens = stats.vision.tokens(size) * workload.images_per_row
    frozen = f", frozen: {', '.join(workload.frozen)}" if workload.frozen else ""
    return (
        f" | vision {count(stats.vision_params)} params; {workload.images_per_row:g} image(s) of {size} px per row "
        f"= {tokens:,.0f} of its {workload.seq_len} tokens{frozen}"
    )


def _experts(stats: ModelStats) -> str:
    """A mixture's active share and routing assumption (MFU and compute count active parameters)."""
    if not stats.num_experts:
        return ""
    return (
        f" ({stats.active_params / 1e9:.2f}B active: top-{stats.top_k} of {stats.num_experts} experts, "
        "assumed evenly loaded)"
    )


def headline(model: PlannedModel, cluster: Cluster, workload: Workload) -> str:
    """The table's first line: the model, the GPUs and what a step processes."""
    stats = model.stats
    if model.headline is not None:
        words = model.headline(stats, workload)
    else:
        words = (
            f"model {stats.model_type}: {count(stats.params)} params{_experts(stats)}, {stats.layers} layers, "
            f"hidden {stats.hidden}, vocab {stats.vocab}"
        )
    return (
        f"{words} | {cluster.num_gpus} x {cluster.gpu.name} ({size(cluster.gpu.memory_bytes)} each, "
        f"{cluster.gpus_per_node} per node) | global batch {batch_words(workload)}"
        + (f" x seq {workload.seq_len}" if workload.job.unit == "tokens" else _unit_words(workload))
        + (f" | train.compile {workload.compile}".replace(" True", "") if workload.compile else "")
        + (f" | train.fp8 {workload.fp8}" if workload.fp8 != "none" else "")
        + (f" | method {workload.method}" if workload.method != "full" else "")
        + _images(stats, workload)
    )


def _unit_words(workload: Workload) -> str:
    """What the global batch counts, where ``batch_words`` has not said it (pairs of rows: it has)."""
    return f" {workload.job.unit}" if workload.job.rows_per_example == 1 else ""


def render_table(
    candidates: list[Candidate],
    model: PlannedModel | Any,
    cluster: Cluster,
    workload: Workload,
    show_unrunnable: bool = False,
    appendix: list[str] | None = None,
) -> str:
    """The best runnable plans ("*" marks the choice), the best rejected ones with why, and with
    ``show_unrunnable`` the plans the trainer cannot run yet with the reason; ``appendix``: lines before the legend
    (the scaling view)."""
    model = planned(model)
    runnable = [c for c in candidates if c.runnable]
    fitting = one_reference_each([c for c in runnable if c.fits])[:SHOWN_FITTING]
    rejected = _rejected_shown([c for c in runnable if not c.fits])
    unrunnable = [c for c in candidates if not c.runnable] if show_unrunnable else []
    unrunnable = _best_per_reason(unrunnable, SHOWN_UNRUNNABLE)
    names = [candidate_name(c) for c in fitting + rejected + unrunnable]
    # each shown row as (mark, plan name, the rest): rows alike but for one word of their names become one
    near_ties: list[str] = []
    chosen_rows = []
    for i, c in enumerate(fitting):
        # why each other plan lost, where it beats the choice on a column (faster, or a smaller peak)
        beats = i and (c.time.step_s < fitting[0].time.step_s or c.memory.total_bytes < fitting[0].memory.total_bytes)
        why = why_not(c, fitting[0]) if beats else None
        if why is not None and why.startswith("near tie"):  # said once under the table, its pace on the row
            near_ties.append(_simpler(fitting[0], c).strip(" ()"))
            why = why.split(",")[0] + ")"
        chosen_rows.append(("* " if i == 0 else "  ", candidate_name(c), _numbers(c), why or ""))
    rejected_rows = [("  ", candidate_name(c), "", c.rejected_because or "") for c in rejected]
    unrunnable_rows = [
        ("  ", candidate_name(c), _numbers(c), f"{'fits' if c.fits else c.rejected_because}; "
         f"{(c.unsupported or '').split(';')[0]}")  # the reason, without the advice meant for a recipe
        for c in unrunnable
    ]  # fmt: skip
    chosen_rows, rejected_rows, unrunnable_rows = map(collapsed, (chosen_rows, rejected_rows, unrunnable_rows))
    width = max([len(HEADER[0]), *(len(row[1]) for row in chosen_rows + rejected_rows + unrunnable_rows)])
    per_device = throughput_column(workload)
    step = HEADER[3] + ("*" if model.time_note else "")  # a time model a GPU contradicted: marked, said below
    head = f"{HEADER[0]:{width}s} {HEADER[1]:>9s} {HEADER[2]:>10s} {step:>9s} {per_device:>11s} {HEADER[5]:>6s}"
    lines = [*headline_lines(headline(model, cluster, workload)), "", head]
    lines += [line for row in chosen_rows for line in _rendered(row, width)]
    if near_ties:
        note = f"near tie: within {NEAR_TIE:.0%} of the fastest step, the plan with fewer moving parts is chosen"
        simpler = _joined(near_ties)
        lines.append(textwrap.fill(note + (f" ({simpler})" if simpler else ""), 118, initial_indent="  ",
                                   subsequent_indent="    "))  # fmt: skip
    if fitting:
        lines += slow_step_note(fitting[0], workload)
    if fitting and model.time_note:
        lines.append(textwrap.fill(model.time_note, 118, initial_indent="  ", subsequent_indent="    "))
    if not fitting:
        lines.append("  (no plan the trainer can run fits)")
    else:
        note = offload_note(fitting[0], runnable, model, cluster, workload)
        lines += [note] if note else []
        if fitting[0].method != "full" and model.lm_notes:
            lines.append(adapter_note(fitting[0], candidates, model.stats, workload))
        if model.choice_note is not None:
            lines += model.choice_note(fitting[0], cluster)
        lines += sync_note(fitting[0], runnable, cluster)
        lines += rollout_note(fitting[0], workload)  # online RL: each phase's time and peak
        for capability in CAPABILITIES:  # what the records say of the choice (a reference model's placement)
            if capability.explain is not None:
                lines += capability.explain(fitting[0], runnable, workload)
    if rejected_rows:
        lines += ["", "best rejected:"]
        lines += [line for row in rejected_rows for line in _rendered(row, width)]
    if unrunnable_rows:
        lines += ["", "not runnable yet (bigtrain train refuses these; predicted as if it ran them):"]
        lines += [line for row in unrunnable_rows for line in _rendered(row, width)]
    if appendix:
        lines += ["", *appendix]
    if names:
        lines += ["", "legend (bigtrain plan --legend for all):", *legend(names)]
    return "\n".join(lines)


def _joined(parts: list[str]) -> str:
    """The ways the choice is simpler than its near ties, each said once: "fsdp2 zero2 over deepspeed zero1" and
    "... zero2" as "fsdp2 zero2 over deepspeed zero1/zero2"; "ddp over fsdp2 zero2", "... deepspeed zero1" as "ddp
    over fsdp2 zero2, deepspeed zero1"."""
    grouped: dict[str, dict[str, list[str]]] = {}
    for part in (p for text in parts for p in text.split(", ") if p):
        choice, over, other = part.partition(" over ")
        if not over:
            grouped.setdefault(part, {})
            continue
        engine, _, stage = other.partition(" ")
        stages = grouped.setdefault(choice, {}).setdefault(engine, [])
        if stage and stage not in stages:
            stages.append(stage)
    said = []
    for choice, others in grouped.items():
        if not others:
            said.append(choice)
            continue
        names = [f"{engine} {'/'.join(sorted(stages))}" if stages else engine for engine, stages in others.items()]
        said.append(f"{choice} over {', '.join(names)}")
    return "; ".join(said)


SLOW_STEP_S = 600.0  # a step this long is said under the table, with the batch that makes it so


def slow_step_note(choice: Candidate, workload: Workload) -> list[str]:
    """The chosen step when it takes over SLOW_STEP_S: how long, and the global batch behind it (the default ~1M
    tokens a step where none was given), so that a user sees what to lower."""
    if choice.time.step_s <= SLOW_STEP_S:
        return []
    per = f" x {workload.seq_len} tokens" if workload.job.unit == "tokens" else f" {workload.job.unit}"
    return [
        f"  slow: one step takes {choice.time.step_s / 60:,.0f} min ({choice.time.step_s:,.0f} s) at global batch "
        f"{batch_words(workload)}{per}; a smaller --global-batch-size or more GPUs make it shorter"
    ]


Row = tuple[str, str, str, str]  # (the choice's mark, the plan's name, its columns, why it lost or was rejected)
WIDEST = 160  # columns a line of the table takes at most: a reason that would reach further goes below its row


def _rendered(row: Row, width: int) -> list[str]:
    """A table row as printed: its name padded to ``width``, its columns, its reason (below it, indented, when the
    line would be wider than WIDEST)."""
    mark, name, numbers, reason = row
    head = f"{mark}{name:{width}s}" + (f" {numbers}" if numbers else "")
    if not reason:
        return [head]
    if len(head) + 2 + len(reason) <= WIDEST:
        return [f"{head}{'  ' if numbers else ' '}{reason}"]
    return [head, textwrap.fill(reason, WIDEST, initial_indent="      ", subsequent_indent="      ")]


def headline_lines(text: str) -> list[str]:
    """The table's first line, broken at its ``|`` separators where it would be wider than WIDEST."""
    lines: list[str] = []
    for part in text.split(" | "):
        if lines and len(lines[-1]) + 3 + len(part) <= WIDEST:
            lines[-1] += " | " + part
        else:
            lines.append(part if not lines else f"  {part}")
    return lines


def collapsed(rows: list[Row]) -> list[Row]:
    """Table rows that read the same but for one ``key=value`` word of their plan's names (a period H=20/100/500 the
    model predicts alike) as one row, that word's values joined by "/"; the choice's row is never merged."""
    out: list[Row] = []
    for row in rows:
        merged = _merge(out[-1], row) if out else None
        if merged is not None:
            out[-1] = merged
        else:
            out.append(row)
    return out


def _merge(a: Row, b: Row) -> Row | None:
    """One row of two that differ in one ``key=value`` word of their names only, else None."""
    if a[0].startswith("*") or b[0].startswith("*") or a[2:] != b[2:]:
        return None
    wa, wb = a[1].split(" "), b[1].split(" ")
    if len(wa) != len(wb):
        return None
    differ = [i for i, (x, y) in enumerate(zip(wa, wb, strict=True)) if x != y]
    if len(differ) != 1:
        return None
    key, sep, left = wa[differ[0]].partition("=")
    other, _, right = wb[differ[0]].partition("=")
    if not sep or key != other:
        return None
    wa[differ[0]] = f"{key}={left}/{right}"
    return a[0], " ".join(wa), a[2], a[3]


def _rejected_shown(rejected: list[Candidate]) -> list[Candidate]:
    """The best rejected plans: every memory rejection its own line, a structural reason ("tp=16 crosses ...") once."""
    seen, shown = set(), []
    for c in rejected:
        key = id(c) if "budget" in c.rejected_because else c.rejected_because
        if key not in seen:
            seen.add(key)
            shown.append(c)
        if len(shown) >= SHOWN_REJECTED:
            break
    return shown


def offload_note(
    choice: Candidate, runnable: list[Candidate], model: PlannedModel, cluster: Cluster, workload: Workload
) -> str | None:
    """For a choice that keeps state in host memory: how much, and, for an offloading plan, whether offload was
    needed to fit at all."""
    host = model.host_bytes(choice.plan, replace(workload, method=choice.method))
    if not host:
        return None
    gpus, node = min(cluster.gpus_per_node, cluster.num_gpus), size(cluster.host_bytes_per_node)
    where = f"{size(host)} per GPU in host memory ({size(host * gpus)} per node of {gpus} GPUs, which has {node})"
    if not (choice.offloads or choice.plan.offload_activations):  # a role's copy in host memory, pinned by the recipe
        return f"  host memory: the choice keeps {where}"
    kept = [c for c in runnable if c.fits and not (c.offloads or c.plan.offload_activations)]
    why = (
        "no plan without offload fits"
        if not kept
        else f"plans without offload fit but are slower (best: {describe(kept[0].plan)}, {kept[0].time.step_s:.3f} s)"
    )
    return f"  offload: the choice keeps {where}; {why}"


def sync_note(choice: Candidate, runnable: list[Candidate], cluster: Cluster) -> list[str]:
    """With a slow link between groups of GPUs: what every-step training waits on it, what the choice does about it,
    and the price in the papers' terms (bigtrain measures speed, not the final model's quality)."""
    link = cluster.replica_link
    if link is None:
        return []
    every_step = next((c for c in runnable if c.fits and not settings_of(c.plan).semi_synchronous), None)
    lines = [f"  link: {link.said}"]
    if every_step is not None:
        wait = every_step.time.link_wait_s / every_step.time.step_s
        lines.append(
            f"  every-step training waits {wait:.1%} of its step on it (best: {describe(every_step.plan)}, "
            f"{every_step.time.step_s:.3f} s); semi-synchronous training is chosen above {WAIT_SHARE:.0%}"
        )
    sync = settings_of(choice.plan)
    if not sync.semi_synchronous:
        return lines
    streamed = ""
    if sync.fragments > 1:
        streamed = f", streamed in {sync.fragments} fragments each overlapping {sync.delay} inner steps"
    lines.append(
        f"  {sync.mode}: the {choice.plan.dp_replicate} replica groups train apart and synchronise every {sync.every} "
        f"steps (outer Nesterov lr {sync.outer_lr:g}, momentum {sync.outer_momentum:g}{streamed}); outer state "
        f"(8 bytes per trained parameter of each rank's shard) on the {sync.outer_state}"
    )
    lines.append(
        "  quality, as the papers measured it: DiLoCo (arXiv 2311.08105) with 8 replicas at H=500 matched fully "
        "synchronous training on C4 with 500x less communication; Streaming DiLoCo (arXiv 2501.18512) kept that "
        "quality with about two orders of magnitude less peak bandwidth. bigtrain has not measured the quality of "
        "this model so trained: compare its held-out loss with a synchronous run's before relying on it"
    )
    return [textwrap.fill(line, width=118, subsequent_indent="    ") for line in lines]


def adapter_note(choice: Candidate, candidates: list[Candidate], stats: ModelStats, workload: Workload) -> str:
    """What an adapter choice trains, and (``method: auto``) why not full fine-tuning."""
    trained = trained_params(stats, workload)
    fully = trained - adapter_params(stats, workload.lora_rank)
    base = "a 4-bit NF4 base" if choice.method == "qlora" else f"a frozen {workload.mixed_precision} base"
    beside = f" ({fully / 1e6:.1f} M of them in {', '.join(workload.modules_to_save)}, trained fully)" if fully else ""
    line = (
        f"  {choice.method}: adapters of rank {workload.lora_rank} train {trained / 1e6:.1f} M parameters{beside} "
        f"({trained / stats.params:.2%} of {stats.params / 1e9:.2f} B) on {base}"
    )
    if workload.method == "auto":
        full = next((c for c in candidates if c.method == "full" and c.runnable and c.fits), None)
        if full is None:
            line += "; full fine-tuning fits no plan"
        else:
            how = "only with offload" if full.offloads else "but is slower"
            line += f"; full fine-tuning fits {how} (best: {candidate_name(full)}, {full.time.step_s:.3f} s)"
    return line


def _best_per_reason(ranked: list[Candidate], limit: int) -> list[Candidate]:
    """The best candidate of each distinct reason first (so every missing feature shows its best plan), then the
    next best ones, in rank order, up to ``limit``."""
    firsts: dict[str | None, Candidate] = {}
    for c in ranked:
        firsts.setdefault(c.unsupported, c)
    chosen = list(firsts.values())[:limit]
    rest = [c for c in ranked if all(c is not f for f in chosen)]
    picked = {id(c) for c in chosen + rest[: limit - len(chosen)]}
    return [c for c in ranked if id(c) in picked]


def to_json(
    candidates: list[Candidate], model: PlannedModel | Any, limit: int = 20, include_unrunnable: bool = False
) -> dict[str, Any]:
    """The ``bigtrain plan --json`` contract; ``plan`` is the best plan the trainer can run (candidates[0])."""
    model = planned(model)
    runnable = [c for c in candidates if c.runnable]
    best = runnable[0] if runnable else candidates[0]
    shown = [c for c in runnable if c.fits][:limit] + [c for c in runnable if not c.fits][:limit]
    if include_unrunnable:
        shown += [c for c in candidates if not c.runnable][:limit]
    return {
        "plan": best.plan.to_dict(),
        "method": best.method,
        "compile": best.compile,
        "fp8": best.fp8,
        "fits": best.fits and best.runnable,
        "memory": best.memory.to_dict(),
        "time": best.time.to_dict(),
        "model": model.summary(model.stats) if model.summary is not None else model.stats.summary(),
        "candidates": [c.to_dict() for c in shown],
    }


def what_would_fit(fits_with: dict[str, str]) -> str:
    """One sentence from the alternatives that were found to fit, e.g. more GPUs, offload, a shorter sequence."""
    if not fits_with:
        return (
            "Nothing tried fits: this model needs more GPU memory than offloading, 8x the GPUs or a 16x shorter "
            "sequence provide."
        )
    return "Would fit with " + "; or ".join(fits_with.values()) + "."
