"""Write the generated parts of the docs from the code, so that they cannot drift from it.

    python docs/generate.py           # rewrites the blocks between their markers in README.md and docs/

- the recipe key table (``docs/recipes.md``) from the dataclasses of ``bigtrain/config/schema.py``: every key, its
  default and its documentation, as ``load_recipe`` reads them;
- the capability matrix (``README.md``) from the capability table (``bigtrain/config/capabilities``) and the
  planner's search: for every feature and engine, whether the trainer runs it, and whether ``plan: auto`` offers it;
  and the task and objective tables from their specs (``bigtrain/tasks``, ``bigtrain/objectives``): what each trains
  and what of the matrix it does not run with, asked of the same table with its example model;
- the capability records and the transform order (``docs/architecture.md``) from ``CAPABILITIES`` and ``ORDER``.
``tests/unit/test_docs.py`` fails when a file holds something else than what this script writes.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bigtrain.config.capabilities import (  # noqa: E402
    CAPABILITIES,
    OPTIONS,
    ModelFacts,
    Option,
    Setup,
    first_problem,
    option_defaults,
)
from bigtrain.config.hf import hf_config_from_dict  # noqa: E402
from bigtrain.config.plan import Plan  # noqa: E402
from bigtrain.config.schema import RecipeConfig, TrainConfig, recipe_key  # noqa: E402
from bigtrain.config.workload import Workload  # noqa: E402

SECTIONS = ("model", "data", "train", "parallel", "checkpoint", "lora", "rollout")


def _default(f: dataclasses.Field) -> str:
    value = f.default if f.default is not dataclasses.MISSING else None
    if value is None:
        return "–"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _option_row(option: Option) -> str:
    default = _default(dataclasses.field(default=option.default))
    return f"| `{option.key}` | {default} | {option.doc.replace('|', chr(92) + '|')} |"


def key_table() -> str:
    """Every recipe key with its default and meaning (``–``: unset; the meaning says what it then is)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for section in SECTIONS:
        cls = type(getattr(RecipeConfig(), section))
        for f in dataclasses.fields(cls):
            if f.metadata.get("record_options"):  # the keys capability records bring, listed by their records
                rows += [_option_row(o) for c in CAPABILITIES for o in c.options]
                continue
            doc = f.metadata["doc"].replace("|", "\\|")
            rows.append(f"| `{section}.{recipe_key(f)}` | {_default(f)} | {doc} |")
    out_dir = next(f for f in dataclasses.fields(RecipeConfig) if f.name == "output_dir")
    rows.append(f"| `output_dir` | {_default(out_dir)} | {out_dir.metadata['doc']} |")
    return "\n".join(rows)


# ---- the capability matrix ------------------------------------------------------------------------------------------
ONCE = "once_per_step"
ENGINES = {  # the base plan of each engine column, on 2 ranks
    "DDP": dict(backend="ddp", zero_stage=0, dp_replicate=2, grad_reduce=ONCE),
    "FSDP2": dict(backend="fsdp2", zero_stage=3, dp_shard=2, grad_reduce="every_micro_step"),
    "DeepSpeed ZeRO": dict(backend="deepspeed", zero_stage=3, dp_shard=2, grad_reduce="every_micro_step"),
}
FEATURES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [  # (row, plan fields, train fields)
    ("gradient accumulation", dict(micro_batch_size=1), {}),
    ("hybrid sharding (HSDP: dp_replicate × dp_shard)", dict(dp_replicate=2, dp_shard=2), {}),
    ("tensor parallel (tp)", dict(tp=2), {}),
    ("+ sequence parallel", dict(tp=2, sequence_parallel=True), {}),
    ("+ loss parallel", dict(tp=2, loss_parallel=True), {}),
    (
        "pipeline parallel (GPipe, 1F1B, interleaved, looped BFS; planned: GPipe, 1F1B)",
        dict(pp=2, grad_reduce=ONCE),
        {},
    ),  # noqa: E501
    ("activation checkpointing: full", dict(activation_checkpointing="full"), {}),
    ("activation checkpointing: selective (per op)", dict(activation_checkpointing="selective"), {}),
    ("activation checkpointing: every k-th block", dict(activation_checkpointing="full", checkpoint_every=2), {}),
    ("context parallel (cp, Ulysses all-to-all)", dict(cp=2), {}),
    ("expert parallel (ep, mixtures of experts; all-to-all)", dict(ep=2), {}),
    ("chunked loss (`loss_chunk_tokens`)", dict(loss_chunk_tokens=4096), {}),
    ("offload activations (`offload_activations`)", dict(offload_activations=True), {}),
    ("offload parameters", dict(offload_params=True), {}),
    ("offload optimizer states", dict(offload_optimizer=True), {}),
    ("`train.compile`", {}, dict(compile=True)),
    ("`train.fp8` (torchao float8 linears; GPUs with FP8)", {}, dict(fp8="rowwise")),
    ("LoRA (`train.method: lora`)", {}, dict(method="lora")),
    ("QLoRA (`train.method: qlora`, bf16)", {}, dict(method="qlora", mixed_precision="bf16")),
    ("local SGD / DiLoCo across replica groups (`parallel.sync`)", dict(dp_replicate=2, sync="diloco"), {}),
]
MODEL = dict(
    model_type="llama",
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
)


def _plan(base: dict[str, Any], fields: dict[str, Any]) -> Plan:
    merged = {**base, **fields}
    if base["backend"] == "deepspeed" and fields.get("offload_params"):
        merged["zero_stage"] = 3
    if base["backend"] == "deepspeed" and fields.get("pp", 1) > 1:
        merged["grad_reduce"] = ONCE
    defaults = dict(
        dp_replicate=1, dp_shard=1, tp=1, pp=1, pp_schedule="1f1b", activation_checkpointing="none",
        micro_batch_size=1, offload_optimizer=False, offload_params=False,
    )  # fmt: skip
    own = {k: v for k, v in {**defaults, **merged}.items() if k not in OPTIONS}
    options = {**dict(option_defaults()), **{k: v for k, v in merged.items() if k in OPTIONS}}
    return Plan(**own, options=tuple(sorted(options.items())))


# the rows that need a mixture of experts are asked of a tiny Mixtral (and, for plan: auto, of Mixtral-8x7B)
MOE_MODEL = dict(MODEL, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)


def _cell(plan: Plan, train: TrainConfig, facts: ModelFacts, job: Any = None) -> str:
    problem = first_problem(Setup(plan, train, facts, job=job))
    if problem is None:
        return "yes"
    return "not yet" if problem.rule.kind == "not_built" else "–"


def _planner_offers(fields: dict[str, Any], train_fields: dict[str, Any]) -> str:
    """Whether ``plan: auto`` can choose a plan with the feature (8 H100s, Llama-3-8B; Mixtral-8x7B for ep): a
    runnable candidate."""
    from bigtrain.planner.hardware import make_cluster
    from bigtrain.planner.model_stats import ModelStats, load_model_config
    from bigtrain.planner.search import search

    if train_fields:
        return "plans for it"  # a recipe option, not a choice: the planner keeps to it
    stats = ModelStats.from_config(load_model_config("mixtral-8x7b" if "ep" in fields else "llama-3-8b"))
    workload = Workload(seq_len=2048, global_batch_size=64)
    pins = {k: v for k, v in fields.items() if k not in ("grad_reduce", "dp_shard")}
    candidates = search(stats, make_cluster(8, 8, "H100", "80GB"), workload, fixed=pins)
    return "yes" if any(c.runnable for c in candidates) else "no"


def _job_of(task: Any, objective: str = "auto") -> tuple[ModelFacts, Any]:
    """The facts of a task's example model (``TaskSpec.example``) and the job's facts, resolved as start-up does."""
    from bigtrain.config.schema import ModelConfig
    from bigtrain.job import resolve_job
    from bigtrain.models.build import load_hf_config
    from bigtrain.objectives import OBJECTIVES

    model = ModelConfig(config=dict(task.example), task=task.name)
    example = dict(OBJECTIVES[objective].example_train) if objective in OBJECTIVES else {}
    cfg = RecipeConfig(model=model, train=TrainConfig(objective=objective, **example))
    job, hf_config = resolve_job(cfg, load_hf_config(cfg.model))
    extra = job.task.model_facts(hf_config) if job.task.model_facts is not None else {}
    return ModelFacts.of(hf_config, **extra), job


def _refused(facts: ModelFacts, job: Any) -> list[str]:
    """The matrix's features no engine runs for this model and job (each row's name, without its details); expert
    parallelism asked of a mixture's facts, as in the matrix."""
    moe = ModelFacts.of(hf_config_from_dict(MOE_MODEL))
    out = []
    for name, fields, train_fields in FEATURES:
        train = TrainConfig(global_batch_size=8, objective=job.facts.objective, **train_fields)
        model = moe if "ep" in fields else facts
        cells = [_cell(_plan(base, fields), train, model, job.facts) for base in ENGINES.values()]
        if "yes" not in cells:
            out.append(name.split(" (")[0].lstrip("+ "))
    return out


def task_table() -> str:
    """One row per task spec (``bigtrain/tasks``): what it trains, its unit, the objectives built for it, and what of
    the matrix above no engine runs for it (asked of the table with its example model and its default objective)."""
    from bigtrain.objectives import OBJECTIVES
    from bigtrain.tasks import TASKS

    rows = [
        "| `model.task` | what it trains | throughput | objectives (`train.objective`) | not built with its example |",
        "|---|---|---|---|---|",
    ]
    for task in TASKS.values():
        facts, job = _job_of(task)
        built = [o.name for o in OBJECTIVES.values() if o.reads == task.outputs]
        built = [o for o in built if task.built_objectives is None or o in task.built_objectives]
        objectives = ", ".join(f"**{o}**" if o == task.default_objective else o for o in built)
        refused = ", ".join(_refused(facts, job)) or "–"
        example = f" (example: {facts.model_type})"
        rows.append(f"| `{task.name}` | {task.summary} | {task.unit}/s | {objectives} | {refused}{example} |")
    return "\n".join(rows)


def objective_table() -> str:
    """One row per objective spec (``bigtrain/objectives``): what it minimises, what it reads of a model, the roles
    it needs (plan dimensions) and what of the matrix above no engine runs with it (on the first task it applies to)."""
    from bigtrain.objectives import OBJECTIVES
    from bigtrain.tasks import TASKS

    rows = [
        "| `train.objective` | what it minimises | reads | roles | not built with it |",
        "|---|---|---|---|---|",
    ]
    for objective in OBJECTIVES.values():
        takers = [t for t in TASKS.values() if t.outputs == objective.reads
                  and (t.built_objectives is None or objective.name in t.built_objectives)]  # fmt: skip
        # the task it is the default of that takes every objective of its outputs, else any it is the default of
        own = [t for t in takers if t.default_objective == objective.name]
        task = next((t for t in own if t.built_objectives is None), (own or takers)[0])
        facts, job = _job_of(task, objective.name)
        roles = ", ".join(f"`parallel.{r}`" for r in objective.roles) or "–"
        refused = ", ".join(_refused(facts, job)) or "–"
        rows.append(
            f"| `{objective.name}` | {objective.summary} | {objective.reads} | {roles} | {refused} (on {task.name}) |"
        )
    return "\n".join(rows)


def capability_matrix() -> str:
    facts = ModelFacts.of(hf_config_from_dict(MODEL))
    moe_facts = ModelFacts.of(hf_config_from_dict(MOE_MODEL))
    rows = [
        "| feature | " + " | ".join(ENGINES) + " | `plan: auto` |",
        "|---|" + "---|" * (len(ENGINES) + 1),
    ]
    for name, fields, train_fields in FEATURES:
        train = TrainConfig(global_batch_size=8, **train_fields)
        model = moe_facts if "ep" in fields else facts
        cells = [_cell(_plan(base, fields), train, model) for base in ENGINES.values()]
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {_planner_offers(fields, train_fields)} |")
    from bigtrain.tasks import TASKS

    examples = [_job_of(task) for task in TASKS.values()]
    for c in CAPABILITIES:  # the keys records bring: asked of the first task's example model that takes them
        for o in (o for o in c.options if o.example is not None):  # settings without an example tune a row above
            fields, train = {o.name: o.example}, TrainConfig(global_batch_size=8)
            model, job = next(
                ((f, j) for f, j in examples if first_problem(Setup(_plan(ENGINES["DDP"], fields), train, f,
                                                                    job=j.facts)) is None),
                examples[0],
            )  # fmt: skip
            offers = _planner_offers(fields, {}) if job.task.name == examples[0][1].task.name else "plans for it"
            cells = [_cell(_plan(base, fields), train, model, job.facts) for base in ENGINES.values()]
            rows.append(f"| {c.summary} (`{o.key}`) | " + " | ".join(cells) + f" | {offers} |")
    return "\n".join(rows)


# ---- the capability records and the transform order (docs/architecture.md) -----------------------------------------
def capability_list() -> str:
    """One line per capability record (``bigtrain/config/capabilities``), in ``CAPABILITIES`` order."""
    from bigtrain.config.capabilities import CAPABILITIES

    rows = [
        "| capability | what it is | recipe keys | transforms | rows (invalid / not built / fit) |",
        "|---|---|---|---|---|",
    ]
    for c in CAPABILITIES:
        counts = " / ".join(str(sum(r.kind == kind for r in c.rules)) for kind in ("invalid", "not_built", "fit"))
        keys = ", ".join(f"`{k}`" for k in (*c.keys, *(o.key for o in c.options))) or "–"
        transforms = ", ".join(f"`{t}`" for t in (*c.transforms, *(s.name for s in c.steps))) or "–"
        searched = " (weighed by the search)" if c.variants is not None and not c.pinned_only else ""
        rows.append(f"| `{c.name}` | {c.summary}{searched} | {keys} | {transforms} | {counts} |")
    return "\n".join(rows)


def transform_order() -> str:
    """The model transforms in the order ``parallel/build.py`` applies them, with the planner terms each names."""
    from bigtrain.parallel.transforms import ORDER

    rows = ["| # | transform | planner terms |", "|---|---|---|"]
    for i, t in enumerate(ORDER, 1):
        terms = ", ".join(f"`{term}`" for term in t.planner_terms) or "–"
        rows.append(f"| {i} | `{t.name}` | {terms} |")
    return "\n".join(rows)


# ---- writing them ---------------------------------------------------------------------------------------------------
BLOCKS = {
    ROOT / "docs" / "recipes.md": {"key-table": key_table},
    ROOT / "README.md": {
        "capability-matrix": capability_matrix,
        "task-table": task_table,
        "objective-table": objective_table,
    },
    ROOT / "docs" / "architecture.md": {"capability-list": capability_list, "transform-order": transform_order},
}


def block_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated:{name}:begin -->\n)(.*?)(<!-- generated:{name}:end -->)", re.S)


def rendered(path: Path) -> str:
    """The file as this script would write it."""
    text = path.read_text()
    for name, make in BLOCKS[path].items():
        pattern = block_pattern(name)
        if not pattern.search(text):
            raise SystemExit(f"{path}: no <!-- generated:{name}:begin/end --> markers")
        text = pattern.sub(lambda m, make=make: m.group(1) + make() + "\n" + m.group(3), text)
    return text


def main() -> int:
    for path in BLOCKS:
        path.write_text(rendered(path))
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
