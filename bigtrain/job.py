"""A job: the task a model is trained for and the objective it minimises, resolved from a recipe (or the planner's
arguments) into their specs (``bigtrain/tasks``, ``bigtrain/objectives``).

Everything below the specs receives what it needs of a job as values: the table's rows and the planner read
``Job.facts`` (``config.setup.JobFacts``), the engines a loss (``ObjectiveSpec.make``), export the files a task writes
beside the weights. ``resolve`` is the first phase of start-up; ``bigtrain plan`` and the simulator resolve the same
way from names.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from bigtrain.config.image_keys import ImageDataKeys
from bigtrain.config.schema import RecipeConfig
from bigtrain.config.setup import JobFacts
from bigtrain.errors import ConfigError
from bigtrain.objectives import AUTO as AUTO_OBJECTIVE
from bigtrain.objectives import OBJECTIVES, ObjectiveSpec, objective
from bigtrain.tasks import AUTO as AUTO_TASK
from bigtrain.tasks import TASKS, TaskSpec, detect, resolve, task, task_of_objective


@dataclass(frozen=True)
class Job:
    task: TaskSpec
    objective: ObjectiveSpec
    # the roles this recipe's objective needs, where its train section decides them (grpo's reference only with a
    # KL term, ``ObjectiveSpec.roles_of``); None: the objective's own ``roles``
    roles: tuple[str, ...] | None = None

    @property
    def facts(self) -> JobFacts:
        """What the table's rows, the planner and the simulator read of this job."""
        return JobFacts(
            task=self.task.name,
            objective=self.objective.name,
            unit=self.task.unit,
            rows_per_example=self.objective.rows_per_example,
            roles=self.objective.roles if self.roles is None else self.roles,
            rules=(*self.task.rules, *self.objective.rules),
        )

    @property
    def batch_noun(self) -> str:
        """What one entry of the global batch is: the objective's where its data says (pairs), else a row of the
        task's (a sequence of tokens, an image, an example)."""
        return self.objective.batch_noun or ("sequences" if self.task.unit == "tokens" else self.task.unit)

    @property
    def shown_metrics(self) -> tuple[str, ...]:
        """What the progress bar and the last line show beside the loss: the objective's step metrics, their held-out
        values, then the task's evaluation metrics (each once a step's record holds it)."""
        shown = self.objective.shown
        return (*shown, *(f"eval_{name}" for name in shown), *self.task.metrics)

    @property
    def own_data(self) -> bool:
        """The objective reads data of its own (pairs) instead of the task's."""
        return self.objective.read_data is not None

    def read_data(self, cfg: RecipeConfig, hf_config: Any) -> tuple[Any, Any]:
        """The training and held-out data: the objective's own where it has data of its own, else the task's."""
        reader = self.objective.read_data or self.task.read_data
        return reader(cfg, hf_config)

    def synthetic(self, hf_config: Any, plan: Any, workload: Any, device: Any) -> tuple[Any, Any]:
        """(one synthetic micro-batch, the function that counts a global batch of such) for the simulator."""
        if self.objective.synthetic is not None:
            assert self.objective.count is not None
            return self.objective.synthetic(hf_config, plan, workload, device), self.objective.count
        return self.task.synthetic(hf_config, plan, workload, device), self.task.count


def pair(task_spec: TaskSpec, objective_name: str, key: str = "train.objective") -> Job:
    """The job of a task and an objective (``auto``: the task's own), or a ConfigError naming ``key`` when the
    objective reads what the task's model does not give, or is not built for the task."""
    spec = objective(task_spec.default_objective if objective_name == AUTO_OBJECTIVE else objective_name, key)
    if spec.reads != task_spec.outputs:
        raise ConfigError(spec.refused(task_spec.name))
    built = task_spec.built_objectives
    if built is not None and spec.name not in built:
        raise ConfigError(
            f"{key}={spec.name} with model.task={task_spec.name} is not built yet; use {key}="
            f"{' or '.join(built)}"
        )
    return Job(task_spec, spec)


def every_job() -> list[Job]:
    """Every job built: each task with each objective it takes (the generated docs and the test ledger list them)."""
    jobs = []
    for task_spec in TASKS.values():
        for name in OBJECTIVES:
            try:
                jobs.append(pair(task_spec, name))
            except ConfigError:
                continue  # the objective reads what the task's model does not give, or is not built for it
    return jobs


def resolve_job(cfg: RecipeConfig, hf_config: Any) -> tuple[Job, Any]:
    """The recipe's job for a model config: the task ``model.task`` asks for (``auto``: from the config), the
    objective ``train.objective`` asks for (``auto``: the task's own), checked against each other and against the
    objective's own numbers; and a copy of the config that names the task's class (``architectures``)."""
    hf_config = copy.deepcopy(hf_config)
    asked = cfg.model.task
    if asked == AUTO_TASK:  # an objective that is one task's own (a reward model's) names it
        asked = objective_s_task(detect(hf_config), cfg.train.objective, hf_config.model_type).name
    spec = resolve(hf_config, asked, _key(cfg))
    _check_image_keys(cfg, spec)
    if spec.accepts is not None:
        spec.accepts(hf_config, cfg.model)
    job = pair(spec, cfg.train.objective)
    if job.objective.check is not None:
        job.objective.check(cfg)
    if job.objective.roles_of is not None:
        job = dataclasses.replace(job, roles=job.objective.roles_of(cfg.train))
    return job, hf_config


def _check_image_keys(cfg: RecipeConfig, spec: TaskSpec) -> None:
    """An image key (``config/image_keys.py``) set for a task that does not read it is one line naming the tasks
    that do: ``data.aspect_buckets`` on a classifier would otherwise be silently ignored."""
    for field in dataclasses.fields(ImageDataKeys):
        key, value = f"data.{field.name}", getattr(cfg.data, field.name)
        if value != field.default and key not in spec.keys:
            readers = " or ".join(t.name for t in TASKS.values() if key in t.keys)
            raise ConfigError(
                f"{key}={value!r} is read by model.task {readers}; this recipe's task is {spec.name}: drop {key}"
            )


def objective_s_task(detected: TaskSpec, objective_name: str, model_type: str) -> TaskSpec:
    """With ``model.task: auto``, the task a model is trained for: the one detected, unless the objective asked is
    one task's own and reads other outputs (``train.objective: reward`` on a causal LM's folder: a reward model of
    it; ``tasks.task_of_objective``)."""
    spec = OBJECTIVES.get(objective_name)  # None: auto, or a name the pairing refuses in its own words
    return task_of_objective(detected, objective_name, getattr(spec, "reads", detected.outputs), model_type)


def _key(cfg: RecipeConfig) -> str:
    from bigtrain.models.build import config_key

    return config_key(cfg.model)


def named_job(task_name: str = "causal-lm", objective_name: str = AUTO_OBJECTIVE) -> Job:
    """The job of a task and an objective named (the planner's arguments, a test's)."""
    return pair(task(task_name), objective_name)


def job_facts(objective_name: str = AUTO_OBJECTIVE, task_name: str = "causal-lm") -> JobFacts:
    """``named_job(...).facts``: what a planner's workload carries of a job."""
    return named_job(task_name, objective_name).facts


__all__ = ["AUTO_TASK", "Job", "OBJECTIVES", "TASKS", "every_job", "job_facts", "named_job", "pair", "resolve_job"]
