"""Every capability and every pair of capabilities, on every engine, for every job, and how the suite decides it.

The capabilities are the rows of the README's generated capability matrix (``docs/generate.py``: each turned on by
its plan or train fields), the engines its columns (DDP, FSDP2, DeepSpeed ZeRO), the jobs every task with every
objective it takes (``bigtrain.job.every_job``), each judged with its task's real example model
(``TaskSpec.example``: a ResNet's BatchNorm and convolutions, a vision-language model's tower; a mixture's for
expert parallelism on a causal LM). A capability, or a pair, of a job on an engine is decided when
- a row of the capability table refuses it (``first_problem``, with the job's facts and rules): users get that
  row's words;
- an equivalence case of that job runs it on that engine against a plain loop (``tests/ledger.py`` reads them from
  the test modules);
- the simulator steps a plan of that job holding it (the memory cases, or ``covering_plans``: a few plans that each
  hold many of what is left, run by ``tests/distributed/test_pair_simulation.py`` on the job's example model).
"""

from __future__ import annotations

import importlib.util
import itertools
from dataclasses import dataclass, field
from typing import Any

from helpers import REPO
from ledger import Ran, equivalence_cases, simulator_cases

from bigtrain.config.capabilities import CAPABILITIES, ModelFacts, Setup, first_problem
from bigtrain.config.plan import Plan
from bigtrain.config.schema import TrainConfig
from bigtrain.config.setup import JobFacts


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
MOE_FACTS = ModelFacts.of(GEN.hf_config_from_dict(GEN.MOE_MODEL))


@dataclass(frozen=True)
class JobCase:
    """A job as the ledger asks the table about it: its name ("task/objective"), its task's example model (what the
    covering plans simulate) and that model's facts, and the job's facts."""

    name: str
    model: dict[str, Any] = field(hash=False)
    facts: ModelFacts = field(hash=False)
    job: JobFacts = field(hash=False)


def _jobs() -> tuple[JobCase, ...]:
    from bigtrain.config.schema import ModelConfig, RecipeConfig
    from bigtrain.job import every_job, resolve_job
    from bigtrain.models.build import load_hf_config

    out = []
    for job in every_job():
        facts, resolved = GEN._job_of(job.task, job.objective.name)
        # the example as start-up resolves it: its config names the task's class (what the simulator reads)
        cfg = RecipeConfig(model=ModelConfig(config=dict(job.task.example), task=job.task.name))
        _, hf_config = resolve_job(cfg, load_hf_config(cfg.model))
        model = {**hf_config.to_dict(), "model_type": hf_config.model_type}
        out.append(JobCase(f"{job.task.name}/{job.objective.name}", model, facts, resolved.facts))
    return tuple(out)


JOBS = _jobs()
LM_JOB = JOBS[[j.name for j in JOBS].index("causal-lm/sft")]


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


def combined(engine: str, features: tuple[Feature, ...], job: JobCase = LM_JOB) -> tuple[Plan, TrainConfig]:
    fields = {k: v for f in features for k, v in f.plan}
    train = {k: v for f in features for k, v in f.train}
    return GEN._plan(ENGINES[engine], fields), TrainConfig(global_batch_size=8, objective=job.job.objective, **train)


def facts_for(features: tuple[Feature, ...], job: JobCase = LM_JOB) -> ModelFacts:
    """The job's example model's facts; a mixture's for expert parallelism on a causal LM (the matrix's row)."""
    moe = job.job.task == "causal-lm" and any(k == "ep" for f in features for k, _ in f.plan)
    return MOE_FACTS if moe else job.facts


def refusal(engine: str, features: tuple[Feature, ...], job: JobCase = LM_JOB) -> str | None:
    """The table's row that refuses the features together on the engine for the job, or None."""
    plan, train = combined(engine, features, job)
    problem = first_problem(Setup(plan, train, facts_for(features, job), job=job.job))
    return None if problem is None else problem.rule.name


NONE = Feature("", (), ())  # the second of a "pair" that is one capability of a job alone


def pairs() -> list[tuple[JobCase, str, Feature, Feature]]:
    """(job, engine, a, b) for every job and engine: each feature alone (b is ``NONE``: tasks x objectives x
    capabilities), and every two features that are two things."""
    two = [(a, b) for a, b in itertools.combinations(FEATURES, 2) if _two_things(a, b)]
    one = [(a, NONE) for a in FEATURES]
    return [(job, engine, a, b) for job in JOBS for engine in ENGINES for a, b in one + two]


def _held(a: Feature, b: Feature) -> tuple[Feature, ...]:
    return (a,) if b is NONE else (a, b)


def _two_things(a: Feature, b: Feature) -> bool:
    """Not two values of one setting (checkpointing full / selective, LoRA / QLoRA); full checkpointing and
    checkpointing every k-th block (full, on every other block) go together."""
    ac = {"activation_checkpointing"}
    values = lambda f: {v for k, v in f.plan if k in ac}  # noqa: E731
    one_knob = (bool(values(a)) and bool(values(b)) and values(a) != values(b)) or {"method"} <= a.keys & b.keys
    return not (a.keys & b.keys - ac) and not one_knob


def runs_together(job: JobCase, engine: str, a: Feature, b: Feature, cases: list[Ran]) -> list[Ran]:
    return [r for r in cases if r.job == job.name and engine_of(r) == engine and holds(a, r) and holds(b, r)]


# what the simulator cannot step (bigtrain/measure/simulate.not_simulated) or steps without the capability
NOT_SIMULATED_KEYS = {"ep", "loss_parallel", "compile", "fp8"}


def simulatable(engine: str, features: tuple[Feature, ...]) -> bool:
    if ENGINES[engine]["backend"] == "deepspeed":
        return False
    return not any(f.keys & NOT_SIMULATED_KEYS for f in features)


def covering_plans(job: JobCase, engine: str, left: list[tuple[Feature, ...]]) -> list[tuple[Feature, ...]]:
    """A few feature sets the table allows for the job that together hold every pair (or lone feature) of ``left``
    (greedy: start from the first not yet held, add each feature that the table still allows and that holds one not
    yet held)."""
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
            if gains and refusal(engine, trial, job) is None:
                chosen.append(feature)
        sets.append(tuple(chosen))
        todo = [p for p in todo if not set(p) <= set(chosen)]
    return sets


Key = tuple[str, str, str, str]  # (job, engine, a, b): b is "" for a capability of the job alone
Left = dict[tuple[JobCase, str], list[tuple[Feature, ...]]]


def _decided_by_rows_and_cases() -> tuple[dict[Key, str], Left]:
    """How the table, the equivalence cases and the memory cases decide the pairs, and what they leave, by job and
    engine."""
    equivalence, simulated = equivalence_cases(), simulator_cases()
    out: dict[Key, str] = {}
    left: Left = {(job, engine): [] for job in JOBS for engine in ENGINES}
    for job, engine, a, b in pairs():
        key = (job.name, engine, a.name, b.name)
        row = refusal(engine, _held(a, b), job)
        if row is not None:
            out[key] = f"row: {row}"
        elif cases := runs_together(job, engine, a, b, equivalence):
            out[key] = f"equivalence: {cases[0].where}"
        elif cases := runs_together(job, engine, a, b, simulated):
            out[key] = f"simulator: {cases[0].where}"
        else:
            left[(job, engine)].append(_held(a, b))
    return out, left


def decisions() -> dict[Key, str]:
    """(job, engine, a, b) -> how it is decided: 'row: NAME', 'equivalence: CASE', 'simulator: CASE',
    'covering plan JOB ENGINE N', or 'undecided'."""
    out, left = _decided_by_rows_and_cases()
    for (job, engine), todo in left.items():
        plans = covering_plans(job, engine, todo)
        for held in todo:
            index = next((i for i, s in enumerate(plans) if set(held) <= set(s)), None)
            key = (job.name, engine, held[0].name, held[1].name if len(held) > 1 else "")
            out[key] = "undecided" if index is None else f"covering plan {job.name} {engine} {index}"
    return out


def all_covering_plans() -> list[tuple[JobCase, str, tuple[Feature, ...]]]:
    """Every (job, engine, features) the pair simulation runs."""
    _, left = _decided_by_rows_and_cases()
    return [(job, engine, plan) for (job, engine), todo in left.items() for plan in covering_plans(job, engine, todo)]


def workload_of(job: JobCase, train: TrainConfig) -> Any:
    """The step a covering plan simulates for the job: its task's sizes for the example model as ``bigtrain plan``
    asks them (``TaskSpec.sizes``: a row of tokens, an image side, a row's images), a global batch of 8, and for an
    objective that generates first (grpo) its rollout."""
    from bigtrain.api.request import PYTHON
    from bigtrain.config.workload import Generation, Workload
    from bigtrain.job import named_job
    from bigtrain.planner.model_stats import load_model_config
    from bigtrain.tasks.spec import PlanAsk

    spec = named_job(job.job.task, job.job.objective)
    config = load_model_config(job.model)
    ask = PlanAsk(config, None, None, None, None, 8, train.method, 2, spec.objective.rows_per_example, PYTHON)
    sizes = spec.task.sizes(ask)
    generation = None
    if spec.objective.generation is not None:  # online RL: the rollout before the step, on half-row prompts
        prompt = sizes["seq_len"] // 2
        generation = Generation(prompt, sizes["seq_len"] - prompt, num_generations=4)
    return Workload(
        method=train.method, mixed_precision=train.mixed_precision, job=job.job, generation=generation, **sizes
    )
