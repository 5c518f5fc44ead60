"""What a plan is asked for: the model, the hardware and the workload, read from keyword arguments (``bigtrain.plan``)
or from the command line's flags (``bigtrain plan``, ``bigtrain export``), with the same checks and the same words.

Errors name the argument as the caller wrote it: ``--seq-len`` on the command line, ``seq_len=`` in Python.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from bigtrain.api.rollout_request import rollout_of, whole_groups
from bigtrain.config.capabilities import OPTIONS
from bigtrain.config.hf import model_config_object
from bigtrain.config.load import check_minimum, coerce, load_recipe, record_option_value
from bigtrain.config.plan import ZERO_STAGES
from bigtrain.config.resolve import recipe_data_facts
from bigtrain.config.schema import FP8_CHOICES, METHODS, PRECISIONS, ParallelConfig, RecipeConfig
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.job import OBJECTIVES, Job, objective_s_task, pair
from bigtrain.objectives import AUTO as AUTO_OBJECTIVE
from bigtrain.planner.hardware import GPU, Cluster, detect_local, lookup_gpu, parse_memory, replica_link_of
from bigtrain.planner.model_stats import load_model_config
from bigtrain.planner.planned import PlannedModel
from bigtrain.planner.search import PLAN_FIELDS
from bigtrain.runtime import LaunchEnv
from bigtrain.tasks import AUTO as AUTO_TASK
from bigtrain.tasks import detect, resolve, task
from bigtrain.tasks.spec import PlanAsk

ModelSpec = typing.Union[str, Path, dict, Any]  # noqa: UP007 - a preset, folder, config dict, PretrainedConfig, module


@dataclass(frozen=True)
class Spelling:
    """How the caller names an argument in messages: ``--gpus`` (command line) or ``gpus=`` (Python)."""

    cli: bool

    def __call__(self, name: str) -> str:
        """The argument's name: ``--gpus-per-node`` or ``gpus_per_node``."""
        return f"--{name.replace('_', '-')}" if self.cli else name

    def value(self, name: str, value: Any) -> str:
        """The argument with a value: ``--gpus 3`` or ``gpus=3``."""
        return f"{self(name)} {value}" if self.cli else f"{name}={value!r}"

    def example(self, name: str, placeholder: str) -> str:
        """The argument with a placeholder: ``--gpus N`` or ``gpus=N``."""
        return f"{self(name)} {placeholder}" if self.cli else f"{name}={placeholder}"


CLI, PYTHON = Spelling(True), Spelling(False)


@dataclass
class Hardware:
    """The hardware arguments, as given (None: detect or default)."""

    gpus: int | None = None
    gpus_per_node: int | None = None
    gpu: str | None = None
    gpu_memory: str | int | None = None
    host_memory: str | None = None
    hardware_profile: str | None = None
    network: dict[str, Any] | None = None  # the slow link between groups of GPUs (``hardware.replica_link_of``'s keys)


@dataclass
class PlanRequest:
    model: PlannedModel  # the job's model as the planner weighs it (its task's statistics and terms)
    model_config: dict[str, Any]
    cluster: Cluster
    workload: Workload
    fixed: dict[str, Any]
    model_source: str | None = None  # a local HF folder the model came from (what a recipe's name_or_path takes)
    recipe: RecipeConfig | None = None
    model_given: bool = False  # the model was an argument (it wins over the recipe's)
    spell: Spelling = CLI  # how the caller names its arguments (in messages and suggestions)
    job: Job | None = None  # the task and objective planned for (None: a causal LM's next-token loss)

    @property
    def stats(self) -> Any:
        """The task's statistics of the model (``ModelStats``, ``ClassifierStats``)."""
        return self.model.stats


def model_config_of(model: ModelSpec, spell: Spelling = CLI) -> tuple[dict[str, Any], str | None]:
    """A full HF config dict from what ``bigtrain.plan`` takes as ``model``, and the local folder it came from."""
    if isinstance(model, (str, Path)):
        path = Path(model)
        folder = str(path) if path.is_dir() and (path / "config.json").is_file() else None
        return load_model_config(str(model), key=spell("model")), folder
    if isinstance(model, dict):
        return load_model_config(model), None
    config = getattr(model, "config", model)  # a built model (or a peft model around one): its config
    if hasattr(config, "to_dict") and hasattr(config, "model_type"):
        return load_model_config({**config.to_dict(), "model_type": config.model_type}), None
    raise ConfigError(
        f"model={type(model).__name__}: pass a preset name, a local HF model folder, a config.json path, a config "
        "dict, a transformers PretrainedConfig, or a model with a .config"
    )


def parse_fix(items: dict[str, Any] | list[str], spell: Spelling = CLI) -> dict[str, Any]:
    """Pinned plan fields, each read and checked exactly as the recipe's ``parallel.key``: ``--fix key=value`` items
    on the command line, a dict in Python."""
    pairs: list[tuple[str, Any, str]] = []
    if isinstance(items, dict):
        pairs = [(k, v, f"fix[{k!r}]") for k, v in items.items()]
    else:
        for item in items:
            key, sep, text = item.partition("=")
            key = key.strip()
            if not sep:
                key = ""  # reported below as an unknown field
            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError:
                value = text
            pairs.append((key, value, item))
    hints = typing.get_type_hints(ParallelConfig)
    out: dict[str, Any] = {}
    shown_key = "--fix" if spell.cli else "fix"
    for key, value, shown in pairs:
        if key not in PLAN_FIELDS:
            where = f"--fix {shown!r}" if spell.cli else shown
            raise ConfigError(f"{where}: unknown plan field; use one of {', '.join(PLAN_FIELDS)}")
        if value is None:
            raise ConfigError(f"{shown_key} {key}= needs a value")
        if key in OPTIONS:  # a key a capability record brings
            out[key] = record_option_value(key, value, f"{shown_key} ")
            continue
        out[key] = coerce(value, hints[key], f"{shown_key} {key}")
        check_minimum(f"parallel.{key}", out[key], shown=f"{shown_key} {key}")
        if key == "zero_stage" and not any(out[key] in stages for stages in ZERO_STAGES.values()):
            modes = ", ".join(f"{', '.join(map(str, v))} ({k})" for k, v in ZERO_STAGES.items())
            raise ConfigError(f"{shown_key} zero_stage={out[key]} is not a stage of any backend; use {modes}")
    return out


def cluster_of(hw: Hardware, no_gpu: str, spell: Spelling = CLI) -> Cluster:
    """The cluster the arguments describe, else this machine's GPUs; under a launcher the whole job's (a job without
    GPUs: its CPU processes), which asks every rank, unless ``gpus`` and ``gpu`` or ``gpu_memory`` are all given.
    With a ``bigtrain probe`` profile, its measured rates and link. ``no_gpu``: the error when there is nothing to
    plan for."""
    _check_counts(hw, spell)
    per_node, name, count, free = hw.gpus_per_node, None, 0, None
    if not (hw.gpus and (hw.gpu or hw.gpu_memory)):
        from bigtrain.runtime import read_launch_env

        env = read_launch_env()
        if env.launched:  # inside torchrun/accelerate: the whole job, limited by its most constrained rank
            count, local, free, name = _job_hardware(env, keep_group=not spell.cli)
            per_node = per_node or local
            if name is None and not (hw.gpus or hw.gpu):  # a job on CPUs: its processes, as plan: auto sees them
                return _with_profile(_cpu_job(hw, count, per_node, free, spell), hw, stated=True)
            free = free if name is not None else None  # CPUs planned for named GPUs: the GPU's memory
        else:
            name, count, free = detect_local()
    gpus = hw.gpus or count
    if not gpus:
        raise ConfigError(no_gpu)
    gpu = _gpu_type(hw.gpu, name, spell)
    memory = _memory(hw.gpu_memory, "gpu_memory", spell) or free
    if memory:
        gpu = replace(gpu, memory_bytes=memory)
    gpu = _named_as_given(gpu, hw, name)
    host = _memory(hw.host_memory, "host_memory", spell)
    per_node = per_node or min(gpus, 8)
    link = replica_link_of(gpus, per_node, **(hw.network or {}), spell=spell)
    cluster = Cluster(gpu, gpus, per_node, host_memory_bytes=host, replica_link=link)
    return _with_profile(cluster, hw, stated=bool(memory))


def written_plan_cluster(hw: Hardware, spell: Spelling = CLI) -> Cluster:
    """The GPUs a written plan of ``hw.gpus`` ranks is predicted on, asking no other rank (its world is known):
    ``gpu`` / ``gpu_memory`` as given, else this machine's GPU type at its table's memory, else an H100."""
    _check_counts(hw, spell, whole_nodes=False)  # whether the nodes are whole is the export target's to say
    detected = None
    if hw.gpu is None:
        import torch

        detected = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    gpu = _gpu_type(hw.gpu, detected, spell)
    memory = _memory(hw.gpu_memory, "gpu_memory", spell)
    if memory:
        gpu = replace(gpu, memory_bytes=memory)
    gpu = _named_as_given(gpu, hw, detected)
    world = hw.gpus or 1
    cluster = Cluster(gpu, world, min(hw.gpus_per_node or 8, world))
    return _with_profile(cluster, hw, stated=bool(memory))


def _named_as_given(gpu: GPU, hw: Hardware, detected: str | None) -> GPU:
    """Only a memory given (no GPU type, none detected): the GPU is named by that memory, and the table's H100
    speeds it is timed with are said, not passed off as the user's GPU."""
    if hw.gpu is None and detected is None and hw.gpu_memory is not None:
        return replace(gpu, name=f"GPU with {gpu.name} speeds")
    return gpu


def _check_counts(hw: Hardware, spell: Spelling, whole_nodes: bool = True) -> None:
    for name in ("gpus", "gpus_per_node"):
        value = getattr(hw, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"{spell.value(name, value)} must be a whole number of GPUs")
        if value is not None and value < 1:
            raise ConfigError(f"{spell.value(name, value)} must be at least 1")
    if whole_nodes and hw.gpus and hw.gpus_per_node and hw.gpus > hw.gpus_per_node and hw.gpus % hw.gpus_per_node:
        raise ConfigError(
            f"{spell.value('gpus', hw.gpus)} is not a whole number of nodes of "
            f"{spell.value('gpus_per_node', hw.gpus_per_node)}; use a multiple such as "
            f"{hw.gpus // hw.gpus_per_node * hw.gpus_per_node or hw.gpus_per_node}"
        )


def _gpu_type(asked: str | None, detected: str | None, spell: Spelling) -> GPU:
    """The GPU as asked (an unknown name is an error), else as detected (an unknown one planned at H100 speeds under
    its own name, as plan: auto does: its memory is measured anyway), else an H100."""
    if asked is not None:
        return lookup_gpu(asked, shown_as=spell("gpu"))
    if detected is None:
        return lookup_gpu("H100")
    try:
        return lookup_gpu(detected)
    except ConfigError:
        return replace(lookup_gpu("H100"), name=detected)


def _memory(value: str | int | None, name: str, spell: Spelling) -> int | None:
    """Bytes from a size such as "80GB" or a byte count; None when not given."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{spell.value(name, value)} must be a size such as '80GB' or a number of bytes")
    memory = parse_memory(value, spell(name)) if isinstance(value, str) else value
    if memory < 1:
        raise ConfigError(f"{spell.value(name, value)} must be positive")
    return memory


def _with_profile(cluster: Cluster, hw: Hardware, stated: bool) -> Cluster:
    """The cluster with a ``bigtrain probe`` profile's measured rates and link (its memory kept when stated)."""
    if not hw.hardware_profile:
        return cluster
    from bigtrain.planner.profile import gpu_from_profile, load_profile

    memory = cluster.gpu.memory_bytes if stated else None
    return replace(cluster, gpu=gpu_from_profile(load_profile(hw.hardware_profile), cluster.gpu, memory_bytes=memory))


def _cpu_job(hw: Hardware, world: int, per_node: int, free: int, spell: Spelling) -> Cluster:
    """A launched job without GPUs: its processes planned as devices of the smallest share of host memory any rank
    has (the CPU stand-in ``plan: auto`` uses; nothing to offload to)."""
    from bigtrain.planner.auto import CPU

    gpu = replace(CPU, memory_bytes=_memory(hw.gpu_memory, "gpu_memory", spell) or free)
    return Cluster(gpu, world, max(1, min(per_node, world)), host_memory_bytes=0)


def no_gpu_message(spell: Spelling) -> str:
    return (
        f"no GPU detected on this machine; give {spell.example('gpus', 'N')} (and {spell.example('gpu', 'NAME')} or "
        f"{spell.example('gpu_memory', 'SIZE')})"
    )


def build_request(
    model: ModelSpec | None,
    recipe: str | Path | RecipeConfig | None,
    hw: Hardware,
    *,
    seq_len: int | None = None,
    global_batch_size: int | None = None,
    mixed_precision: str | None = None,
    method: str | None = None,
    lora_r: int | None = None,
    compile: bool | str | None = None,
    fp8: str | None = None,
    fix: dict[str, Any] | list[str] | None = None,
    spell: Spelling = CLI,
    cluster: Cluster | None = None,
    objective: str | None = None,
    epochs: float | None = None,
    image_size: int | None = None,
    images_per_row: float | None = None,
    rollout: dict[str, Any] | None = None,
) -> PlanRequest:
    """The search's inputs: arguments first, then the recipe's values, then the task's defaults (a causal LM: a
    ~1M-token global batch, the model's positions up to 2048; a classifier: its usual examples per GPU at its own
    image size), bf16, full fine-tuning. ``cluster``: one already made from ``hw``."""
    cfg = recipe if isinstance(recipe, RecipeConfig) or recipe is None else load_recipe(recipe)
    if model is not None:
        model_config, source = model_config_of(model, spell)
    elif cfg is not None:  # the recipe's model, checked with the words bigtrain train uses
        from bigtrain.job import resolve_job
        from bigtrain.models.build import load_hf_config

        _, hf_config = resolve_job(cfg, load_hf_config(cfg.model))  # naming its task's class, as start-up does
        model_config = load_model_config({**hf_config.to_dict(), "model_type": hf_config.model_type})
        source = cfg.model.name_or_path
    else:
        raise ConfigError(f"bigtrain plan needs a model: {spell.example('model', 'PRESET|PATH')}, or a recipe")
    _check_choice(spell, "mixed_precision", mixed_precision, PRECISIONS)
    _check_choice(spell, "method", method, METHODS)
    _check_choice(spell, "fp8", fp8, FP8_CHOICES)
    job = job_of(model_config, cfg, objective, spell)
    # grpo: the rows are prompt + completion, its roles as its train section says (rollout_request.py)
    asked_rollout = rollout_of(job, cfg, rollout, seq_len, spell)
    job, seq_len = asked_rollout.job, asked_rollout.seq_len
    if epochs is not None and not epochs > 0:
        raise ConfigError(f"{spell.value('epochs', epochs)} must be above 0: the passes the run makes over its data")
    if compile not in (None, True, False, "auto"):
        raise ConfigError(f"{spell.value('compile', compile)} is not one of true, false, auto")
    cluster = cluster or cluster_of(hw, no_gpu_message(spell), spell)
    for name, value, minimum in (("seq_len", seq_len, 2), ("global_batch_size", global_batch_size, 1)):
        if value is not None and value < minimum:
            raise ConfigError(f"{spell.value(name, value)} must be at least {minimum}")
    method = method or (cfg.train.method if cfg else "full")
    ask = PlanAsk(model_config, cfg, seq_len, image_size, images_per_row, global_batch_size, method,
                  cluster.num_gpus, job.objective.rows_per_example, spell)  # fmt: skip
    lora_rank = lora_r if lora_r is not None else (cfg.lora.r if cfg else 16)
    if lora_rank < 1:
        raise ConfigError(f"{spell.value('lora_r', lora_rank)} must be at least 1")
    workload = Workload(
        mixed_precision=mixed_precision or (cfg.train.mixed_precision if cfg else "bf16"),
        compile=compile if compile is not None else (cfg.train.compile if cfg else False),
        fp8=fp8 or (cfg.train.fp8 if cfg else "none"),
        method=method,
        lora_rank=lora_rank,
        modules_to_save=tuple(cfg.lora.modules_to_save or ()) if cfg else (),
        job=job.facts,
        epochs=epochs or 1.0,
        **_data_of(cfg, model_config),
        **whole_groups(job.task.sizes(ask), asked_rollout.generation, global_batch_size, spell),
        generation=asked_rollout.generation,
    )
    planned = job.task.planner(model_config, workload)
    fixed = parse_fix(fix or [], spell)
    return PlanRequest(planned, model_config, cluster, workload, fixed, source, cfg, model is not None, spell, job)


def job_of(model_config: dict[str, Any], cfg: RecipeConfig | None, objective: str | None, spell: Spelling) -> Job:
    """The job a plan is asked for: the recipe's task (``model.task``) or the model's own (a preset's as recorded,
    without asking transformers), and the objective asked, else the recipe's, else the task's own."""
    from bigtrain.planner.known_configs import recorded_task

    if cfg is not None and cfg.model.task != AUTO_TASK:
        spec = resolve(model_config_object(dict(model_config)), cfg.model.task)
    elif (name := recorded_task(model_config)) is not None:
        spec = task(name)
    else:
        spec = detect(model_config_object(dict(model_config)))
    asked = objective or (cfg.train.objective if cfg else AUTO_OBJECTIVE)
    if asked != AUTO_OBJECTIVE and asked not in OBJECTIVES:
        raise ConfigError(f"{spell.value('objective', asked)} is not an objective; use auto, {', '.join(OBJECTIVES)}")
    if cfg is None or cfg.model.task == AUTO_TASK:
        spec = objective_s_task(spec, asked, model_config["model_type"])
    return pair(spec, asked, key="train.objective" if objective is None else spell("objective"))


def _data_of(cfg: RecipeConfig | None, model_config: dict[str, Any]) -> dict[str, Any]:
    """How a recipe's data is read (packed documents, the attention), for the table's data rows; defaults without."""
    if cfg is None:
        return {}
    facts = recipe_data_facts(cfg, model_config_object(dict(model_config)))
    return {} if facts is None else {"packed": facts.packed, "attention": facts.attention}


def _check_choice(spell: Spelling, name: str, value: str | None, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise ConfigError(f"{spell.value(name, value)} is not one of {', '.join(choices)}")


KEPT_GROUP_TIMEOUT_S = 1800  # a group left for the user's trainer: the HF Trainer's own default (ddp_timeout)


def _job_hardware(env: LaunchEnv, keep_group: bool) -> tuple[int, int, int, str | None]:
    """(world size, ranks per node, smallest free memory of any rank's own device, this rank's device name or None
    on CPUs) of a launched job. Asking every rank needs the job's process group: an existing one is used; else one
    is started, and kept for the trainer that follows with ``keep_group`` (a group started again over torchrun's
    store would meet the first one's stale addresses), destroyed without (the command line trains nothing after)."""
    import torch
    import torch.distributed as dist

    from bigtrain.runtime import init_process_group, pick_device, smallest_free_memory

    device = pick_device(env)  # this rank's own GPU only: touching the others would give each a CUDA context
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    if dist.is_initialized():  # the user's script made the job's group already: use it, leave it
        return env.world_size, env.local_world_size, smallest_free_memory(env, device), name
    init_process_group(env, device, timeout_s=KEPT_GROUP_TIMEOUT_S if keep_group else 120)
    try:
        return env.world_size, env.local_world_size, smallest_free_memory(env, device), name
    finally:
        if not keep_group:
            dist.destroy_process_group()


@contextmanager
def zero3_init_paused() -> Iterator[None]:
    """While a ``TrainingArguments`` with a ZeRO-3 DeepSpeed config lives in the process, transformers builds every
    model partitioned (``deepspeed.zero.Init``); the planner's probe models are meta-device sketches and must not be.
    The user's config is set back on the way out."""
    import sys

    if "transformers.integrations.deepspeed" not in sys.modules:  # nothing set one: nothing to pause (no import)
        yield
        return
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref  # transformers keeps only a weak reference to it
    config = ref() if ref is not None else None
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if config is not None:
            hf_deepspeed.set_hf_deepspeed_config(config)


def planning(fn: Callable) -> Callable:
    """``fn`` run with ZeRO-3 model building paused (``zero3_init_paused``)."""

    @functools.wraps(fn)
    def wrapper(*args: typing.Any, **kwargs: typing.Any) -> typing.Any:
        with zero3_init_paused():
            return fn(*args, **kwargs)

    return wrapper
