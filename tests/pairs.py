"""Every pair of capabilities on every engine, and how the suite decides it.

The capabilities are the rows of the README's generated capability matrix (``docs/generate.py``: each turned on by
its plan or train fields), the engines its columns (DDP, FSDP2, DeepSpeed ZeRO). A pair on an engine is decided when
- a row of the capability table refuses it (``first_problem``): users get that row's words;
- an equivalence case runs both on that engine against a plain loop (``tests/ledger.py`` reads them from the test
  modules);
- the simulator steps a plan holding both (the memory cases of ``tests/cases.py``, or ``covering_plans``: a few plans
  that each hold many of the pairs left, run by ``tests/distributed/test_pair_simulation.py``).
"""

from __future__ import annotations

import importlib.util
import itertools
from dataclasses import dataclass
from typing import Any

from helpers import REPO
from ledger import Ran, equivalence_cases, simulator_cases

from bigtrain.config.capabilities import CAPABILITIES, ModelFacts, Setup, first_problem
from bigtrain.config.plan import Plan
from bigtrain.config.schema import TrainConfig


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
ENGINES: dict[str, dict[str, Any]] = GEN.ENGINES


@dataclass(frozen=True)
class Feature:
    name: str
    plan: tuple[tuple[str, Any], ...]
    train: tuple[tuple[str, Any], ...]

    @property
    def keys(self) -> set[str]:
        return {k for k, _ in self.plan} | {k for k, _ in self.train}


# every case of the suite accumulates but one (test_equivalence's 1rank-no-accum): accumulation is not a pair's part
FEATURES = tuple(
    Feature(name, tuple(fields.items()), tuple(train.items()))
    for name, fields, train in GEN.FEATURES
    + [(f"`{o.key}`", {o.name: o.example}, {}) for c in CAPABILITIES for o in c.options if o.example is not None]
    if name != "gradient accumulation"
)
# counted as on when the case's value is above these (a degree of parallelism, a chunk size)
DEGREES = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp_replicate": 1, "dp_shard": 1, "checkpoint_every": 1}
AMOUNTS = {"loss_chunk_tokens": 0}
TRAIN_DEFAULTS = {"method": "full", "compile": False, "fp8": "none", "mixed_precision": "fp32"}
FACTS = ModelFacts.of(GEN.hf_config_from_dict(GEN.MODEL))
MOE_FACTS = ModelFacts.of(GEN.hf_config_from_dict(GEN.MOE_MODEL))


def holds(feature: Feature, ran: Ran) -> bool:
    """Whether a case runs the feature: a degree or amount above off, the same value otherwise."""
    for key, value in feature.plan:
        have = ran.parallel.get(key)
        if key in DEGREES:
            if (have or 1) <= DEGREES[key]:
                return False
        elif key in AMOUNTS:
            if (have or 0) <= AMOUNTS[key]:
                return False
        elif have != value:
            return False
    for key, value in feature.train:
        have = ran.train.get(key, TRAIN_DEFAULTS.get(key))
        if key == "mixed_precision":
            continue  # QLoRA's bf16 compute: part of turning it on, not a capability of its own
        if key == "fp8" and have not in (None, "none"):  # either scaling recipe is FP8
            continue
        if have != value:
            return False
    return True


def engine_of(ran: Ran) -> str:
    backend = ran.parallel.get("backend", "fsdp2")
    return next(name for name, base in ENGINES.items() if base["backend"] == backend)


def combined(engine: str, features: tuple[Feature, ...]) -> tuple[Plan, TrainConfig]:
    fields = {k: v for f in features for k, v in f.plan}
    train = {k: v for f in features for k, v in f.train}
    return GEN._plan(ENGINES[engine], fields), TrainConfig(global_batch_size=8, **train)


def facts_for(features: tuple[Feature, ...]) -> ModelFacts:
    return MOE_FACTS if any(k == "ep" for f in features for k, _ in f.plan) else FACTS


def refusal(engine: str, features: tuple[Feature, ...]) -> str | None:
    """The table's row that refuses the features together on the engine, or None."""
    plan, train = combined(engine, features)
    problem = first_problem(Setup(plan, train, facts_for(features)))
    return None if problem is None else problem.rule.name


def pairs() -> list[tuple[str, Feature, Feature]]:
    """(engine, a, b) for every two features that are two things."""
    return [(engine, a, b) for engine in ENGINES for a, b in itertools.combinations(FEATURES, 2) if _two_things(a, b)]


def _two_things(a: Feature, b: Feature) -> bool:
    """Not two values of one setting (checkpointing full / selective, LoRA / QLoRA); full checkpointing and
    checkpointing every k-th block (full, on every other block) go together."""
    ac = {"activation_checkpointing"}
    values = lambda f: {v for k, v in f.plan if k in ac}  # noqa: E731
    one_knob = (bool(values(a)) and bool(values(b)) and values(a) != values(b)) or {"method"} <= a.keys & b.keys
    return not (a.keys & b.keys - ac) and not one_knob


def runs_together(engine: str, a: Feature, b: Feature, cases: list[Ran]) -> list[Ran]:
    return [r for r in cases if engine_of(r) == engine and holds(a, r) and holds(b, r)]


# what the simulator cannot step (bigtrain/measure/simulate.not_simulated) or steps without the capability
NOT_SIMULATED_KEYS = {"ep", "loss_parallel", "compile", "fp8"}


def simulatable(engine: str, features: tuple[Feature, ...]) -> bool:
    if ENGINES[engine]["backend"] == "deepspeed":
        return False
    return not any(f.keys & NOT_SIMULATED_KEYS for f in features)


def covering_plans(engine: str, left: list[tuple[Feature, Feature]]) -> list[tuple[Feature, ...]]:
    """A few feature sets the table allows that together hold every pair of ``left`` (greedy: start from the first
    pair not yet held, add each feature that the table still allows and that holds a pair not yet held)."""
    todo = [p for p in left if simulatable(engine, p)]
    sets: list[tuple[Feature, ...]] = []
    while todo:
        chosen = list(todo[0])
        for feature in FEATURES:
            if feature in chosen or not simulatable(engine, (feature,)):
                continue
            trial = (*chosen, feature)
            if not all(_two_things(f, feature) for f in chosen):
                continue
            gains = any(set(p) <= set(trial) for p in todo)
            if gains and refusal(engine, trial) is None:
                chosen.append(feature)
        sets.append(tuple(chosen))
        todo = [p for p in todo if not set(p) <= set(chosen)]
    return sets


def _decided_by_rows_and_cases() -> tuple[dict[tuple[str, str, str], str], dict[str, list[tuple[Feature, Feature]]]]:
    """How the table, the equivalence cases and the memory cases decide the pairs, and the pairs they leave, by
    engine."""
    equivalence, simulated = equivalence_cases(), simulator_cases()
    out: dict[tuple[str, str, str], str] = {}
    left: dict[str, list[tuple[Feature, Feature]]] = {engine: [] for engine in ENGINES}
    for engine, a, b in pairs():
        key = (engine, a.name, b.name)
        row = refusal(engine, (a, b))
        if row is not None:
            out[key] = f"row: {row}"
        elif cases := runs_together(engine, a, b, equivalence):
            out[key] = f"equivalence: {cases[0].where}"
        elif cases := runs_together(engine, a, b, simulated):
            out[key] = f"simulator: {cases[0].where}"
        else:
            left[engine].append((a, b))
    return out, left


def decisions() -> dict[tuple[str, str, str], str]:
    """(engine, a, b) -> how it is decided: 'row: NAME', 'equivalence: CASE', 'simulator: CASE', 'covering plan N',
    or 'undecided'."""
    out, left = _decided_by_rows_and_cases()
    for engine, todo in left.items():
        plans = covering_plans(engine, todo)
        for a, b in todo:
            index = next((i for i, s in enumerate(plans) if {a, b} <= set(s)), None)
            out[(engine, a.name, b.name)] = "undecided" if index is None else f"covering plan {engine} {index}"
    return out


def all_covering_plans() -> list[tuple[str, tuple[Feature, ...]]]:
    """Every (engine, features) the pair simulation runs."""
    _, left = _decided_by_rows_and_cases()
    return [(engine, plan) for engine, todo in left.items() for plan in covering_plans(engine, todo)]
