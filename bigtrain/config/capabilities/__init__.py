"""What bigtrain can run, one record per capability, and the one table of what runs together that every consumer asks.

Each module here is one capability (``table.Capability``): its recipe keys, its rows of what runs together, how the
planner's search weighs it, its model transforms and its line in the generated capability list. ``CAPABILITIES``
lists them, one line each (``RECORDS``); adding a capability is one new module and its line there.

The table is every record's rows, asked in the order of ``table.KINDS`` (a plan that contradicts itself first, then
what is not built, then what does not fit), records in the order below within a kind; the first row that trips is the
one a user sees. Recipe resolution (``config/resolve.py``), start-up (``train/run.py``), the planner's search and
``plan: auto`` (``planner/search.py``), the simulator and ``bigtrain export`` all ask ``problems`` or ``check``, so
they refuse the same setups with the same words. ``tests/unit/test_capabilities.py`` trips every row through every
consumer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from importlib import import_module

from bigtrain.config.capabilities.table import KINDS, Capability, Kind, ModelStep, Option, Problem, Rule, SearchSpace
from bigtrain.config.model_facts import ModelFacts
from bigtrain.config.setup import DataFacts, JobFacts, Setup
from bigtrain.errors import ConfigError

# the records, one line each, in the order their rows are asked within a kind (``rules_of``)
RECORDS = (
    "data_parallel",
    "tensor_parallel",
    "pipeline",
    "context_parallel",
    "activation_checkpointing",
    "chunked_loss",
    "torch_compile",
    "fp8",
    "adapters",
    "expert_parallel",
    "router_loss",
    "activation_offload",
    "batch_norm",
    "channels_last",
    "replica_sync",
    "reference",
    "frozen_parts",
    "freeze",
)
CAPABILITIES: tuple[Capability, ...] = tuple(import_module(f"{__name__}.{name}").CAPABILITY for name in RECORDS)

__all__ = [
    "CAPABILITIES",
    "RULES",
    "Capability",
    "DataFacts",
    "JobFacts",
    "Kind",
    "ModelFacts",
    "ModelStep",
    "OPTIONS",
    "Option",
    "option_defaults",
    "Problem",
    "Rule",
    "ALL_KINDS",
    "askable",
    "with_job",
    "SearchSpace",
    "Setup",
    "check",
    "first_problem",
    "problems",
    "rules_of",
]


def rules_of_kinds(rules: list[Rule]) -> tuple[Rule, ...]:
    """``rules`` by kind (``KINDS``), in their order within a kind."""
    return tuple(rule for kind in KINDS for rule in rules if rule.kind == kind)


def rules_of(capabilities: Sequence[Capability]) -> tuple[Rule, ...]:
    """The table of these records: their rows by kind (``KINDS``), in record order within a kind."""
    return rules_of_kinds([rule for capability in capabilities for rule in capability.rules])


RULES: tuple[Rule, ...] = rules_of(CAPABILITIES)

# the recipe keys the records bring (Capability.options), by their name under parallel
OPTIONS: dict[str, Option] = {option.name: option for capability in CAPABILITIES for option in capability.options}


def option_defaults() -> tuple[tuple[str, object], ...]:
    """Every record option at its default, as a plan carries them (``Plan.options``)."""
    return tuple(sorted((name, option.default) for name, option in OPTIONS.items()))


_ASKABLE: dict[tuple[int, tuple[Kind, ...], bool, bool, bool], tuple[tuple[Rule, ...], tuple[Rule, ...]]] = {}
_WITH_JOB: dict[tuple[int, tuple[Rule, ...]], tuple[tuple[Rule, ...], tuple[Rule, ...]]] = {}


def askable(
    table: tuple[Rule, ...], kinds: tuple[Kind, ...], model_known: bool, data_known: bool, job_known: bool = False
) -> tuple[Rule, ...]:
    """The rows of these kinds that can be asked. The planner asks hundreds of thousands of plans: filtered once
    per table (kept by identity, with the table: hashing its rows on every question cost more than asking them)."""
    key = (id(table), kinds, model_known, data_known, job_known)
    if key not in _ASKABLE:
        rows = tuple(
            rule
            for rule in table
            if rule.kind in kinds
            and (model_known or not rule.reads_model)
            and (data_known or not rule.reads_data)
            and (job_known or not rule.reads_job)
        )
        _ASKABLE[key] = (table, rows)
    return _ASKABLE[key][1]


def with_job(table: tuple[Rule, ...], job: JobFacts | None) -> tuple[Rule, ...]:
    """``table`` with the job's own rows (its task's and objective's, ``JobFacts.rules``) among them, by kind: the
    capability records' rows first within a kind, then the task's, then the objective's. The same tuple for the same
    table and rows (``askable`` keys its filtering by identity)."""
    if job is None or not job.rules:
        return table
    key = (id(table), job.rules)
    if key not in _WITH_JOB:
        _WITH_JOB[key] = (table, rules_of_kinds([*table, *job.rules]))
    return _WITH_JOB[key][1]


ALL_KINDS: tuple[Kind, ...] = ("invalid", "fit", "not_built")


def problems(setup: Setup, kinds: tuple[Kind, ...] = ALL_KINDS, table: tuple[Rule, ...] = RULES) -> Iterator[Problem]:
    """Every row of the given ``kinds`` that trips for ``setup``, in table order (rows that read the model, the data
    or the job only once their facts are known); the job's own rows with the table's."""
    rows = askable(
        with_job(table, setup.job), kinds, setup.model is not None, setup.data is not None, setup.job is not None
    )
    for rule in rows:
        message = rule.says(setup)
        if message is not None:
            yield Problem(rule, message)


def first_problem(setup: Setup, kinds: tuple[Kind, ...] = ALL_KINDS, table: tuple[Rule, ...] = RULES) -> Problem | None:
    return next(problems(setup, kinds, table), None)


def check(setup: Setup, kinds: tuple[Kind, ...] = ALL_KINDS, table: tuple[Rule, ...] = RULES) -> None:
    """Raise the first tripped row's message as a ConfigError (what a recipe gets at resolution and start-up)."""
    problem = first_problem(setup, kinds, table)
    if problem is not None:
        raise ConfigError(problem.message)
