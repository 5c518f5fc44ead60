"""Start-up in phases, each returning a new value and changing none it was given:

    resolve (recipe, HF config, task, objective) -> data -> start (output_dir, resume) -> plan -> build -> loop

The first four run on every rank before any process group exists (a written plan; ``plan: auto`` plans once the
group can tell every rank's free memory), so a bad input fails everywhere within seconds with one line. What each
phase decides travels in its value: the recipe as the run records it (``cfg``: the objective resolved, a
classifier's head trained beside LoRA, the method, compile and FP8 a resume or the planner chose), the model config
the build reads (a classifier's labels), the job's specs, the data, the plan and the build's options.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from bigtrain.checkpoint.base_model import check_base
from bigtrain.checkpoint.layout import RECIPE, Manifest
from bigtrain.checkpoint.run_dir import Start, plan_start
from bigtrain.config.capabilities import ModelFacts, Setup, check
from bigtrain.config.hf import resolve_attention
from bigtrain.config.load import load_recipe
from bigtrain.config.plan import Plan
from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import ADAPTER_METHODS, RecipeConfig
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.job import Job, resolve_job
from bigtrain.models.build import load_hf_config
from bigtrain.tasks.spec import Prepared
from bigtrain.tasks.token_rows import packed
from bigtrain.train.checks import check_enough_rows, check_writable
from bigtrain.train.trackers import check_tracker


@dataclass(frozen=True)
class Resolved:
    """Phase 1: the recipe (its objective resolved), the model's config (naming its task's class), the job's specs
    and the attention that will run."""

    cfg: RecipeConfig
    hf_config: Any
    job: Job
    attention: str


def resolve(cfg: RecipeConfig) -> Resolved:
    """The model's config read, its task and objective resolved and checked against each other (``bigtrain/job.py``);
    the recipe records the objective it trains."""
    job, hf_config = resolve_job(cfg, load_hf_config(cfg.model))
    # attn_implementation auto: the family's own default (the recipe keeps "auto", as written: it is what a restart
    # compares); the checks below need the implementation that will run
    attention = resolve_attention(hf_config, cfg.model.attn_implementation)
    cfg = with_train(cfg, objective=job.objective.name)
    return Resolved(cfg, hf_config, job, attention)


def check_final_adapter(cfg: RecipeConfig) -> None:
    """An adapter run's final model is peft's adapter folder, which names its base by folder: a model built from
    model.config has none, so the export at the end would fail after every step had trained. Refused before any
    group, after every other check (what else is wrong is said first)."""
    if cfg.train.method not in ADAPTER_METHODS or cfg.model.name_or_path is not None:
        return
    if cfg.checkpoint.save_final_model:
        raise ConfigError(
            f"train.method={cfg.train.method} on a model built from model.config: the final adapter folder names its "
            "base by folder, and this one has none (its values are drawn from train.seed); save the model first "
            "(model.save_pretrained(FOLDER)) and set model.name_or_path, or set checkpoint.save_final_model=false"
        )


@dataclass(frozen=True)
class WithData:
    """Phase 2: what the data adds (``TaskSpec.prepare``, ``TaskSpec.check``): the training and held-out data, the
    recipe and model config as the run builds them, and the notes rank 0 says."""

    cfg: RecipeConfig
    hf_config: Any
    job: Job
    attention: str
    data: Any
    held_out: Any
    notes: tuple[str, ...]
    new_head: bool = False  # the pretrained head does not fit the data's classes

    @property
    def batch(self) -> int:
        return self.cfg.train.global_batch_size

    @property
    def packed(self) -> bool:
        """Rows of packed documents (position ids restarting per document), training or held out."""
        return any(packed(d) for d in (self.data, self.held_out))

    def workload(self) -> Workload:
        """What one step processes, as the planner and the capability table's data rows read it."""
        cfg, task = self.cfg, self.job.task
        epochs = cfg.train.steps * self.batch / max(self.data.num_rows, 1)  # a precomputed reference's share
        workload = Workload.of_train(
            cfg.train, self.data.seq_len, cfg.lora, self.packed, self.attention, epochs, self.job.facts
        )
        spec = self.job.objective
        if spec.generation is not None:  # grpo: a row is the longest prompt and the longest completion
            prompt = self.data.seq_len - cfg.train.max_completion_length
            workload = dataclasses.replace(workload, generation=spec.generation(cfg.train, prompt))
        return task.workload(workload, self.data, cfg) if task.workload is not None else workload

    def model_facts(self) -> ModelFacts:
        task = self.job.task
        extra = task.model_facts(self.hf_config) if task.model_facts is not None else {}
        return ModelFacts.of(self.hf_config, **extra)


def read(resolved: Resolved, is_main: bool) -> WithData:
    """The job's data (the objective's own, or the task's), what it adds to the recipe and the model config, and the
    task's checks of the model against it; then what every job checks (enough rows for a step, a writable
    output_dir, the tracker)."""
    cfg, hf_config, job = resolved.cfg, resolved.hf_config, resolved.job
    data, held_out = job.read_data(cfg, hf_config)
    if cfg.data.sources and not getattr(data, "self_ordered", False):  # a reader that does not blend
        raise ConfigError(
            f"data.sources blends token rows (a causal LM's text, chat or instruction data); this job "
            f"(model.task {job.task.name}, train.objective {job.objective.name}) reads one source: use data.path"
        )
    if cfg.data.streaming and not getattr(data, "streamed", False):  # a reader that does not stream
        raise ConfigError(
            f"data.streaming reads a causal LM's text, chat or instruction records; this job (model.task "
            f"{job.task.name}, train.objective {job.objective.name}) reads its data whole: set data.streaming=false"
        )
    task = job.task
    prepared = task.prepare(cfg, hf_config, data) if task.prepare is not None else Prepared(cfg, hf_config)
    notes = list(prepared.notes)
    if task.check is not None:
        notes += task.check(prepared.cfg, prepared.hf_config, data, resolved.attention, is_main)
    for key, part in (("data.path", data), ("data.eval_path", held_out if cfg.data.eval_path else None)):
        if getattr(part, "cache_note", None):
            notes.append(part.cache_note)
        if part is not None and part.truncated:
            notes.append(
                f"{key}: {part.truncated} of {part.examples} records are longer than data.seq_len="
                f"{cfg.data.seq_len} and were cut; what follows the cut is never trained on (raise data.seq_len)"
            )
    # a record that makes several of the global batch's examples (a prompt: its group of completions) says how many
    per_record = getattr(data, "examples_per_record", 1)
    check_enough_rows(data.num_rows, cfg.train.global_batch_size // per_record, cfg.data.path)
    check_writable(cfg.output_dir)
    check_tracker(cfg.train.log_to)
    return WithData(
        prepared.cfg, prepared.hf_config, job, resolved.attention, data, held_out, tuple(notes), prepared.new_head
    )


def start(loaded: WithData) -> tuple[WithData, Start]:
    """Phase 3: what this start does with output_dir (``plan_start``), and a resumed run's recipe: ``auto`` train
    options keep what its checkpoint trained with; an adapter checkpoint's base must be the same files."""
    cfg = loaded.cfg
    begin = plan_start(cfg)
    if begin.resume_from is None:
        return loaded, begin
    saved = load_recipe(begin.resume_from / RECIPE).train
    kept = {key: getattr(saved, key) for key in ("method", "compile", "fp8") if getattr(cfg.train, key) == "auto"}
    cfg = with_train(cfg, **kept) if kept else cfg
    check_base(cfg.model.name_or_path, Manifest.read(begin.resume_from).base, f"resuming from {begin.resume_from}")
    return dataclasses.replace(loaded, cfg=cfg), begin


def written_plan(cfg: RecipeConfig, job: Job, world_size: int) -> Plan | None:
    """A written plan resolved for the job's world (None under ``plan: auto``), with the job's rows."""
    if cfg.parallel.plan == "auto":
        return None
    return resolve_plan(cfg.parallel, world_size, cfg.train, job.facts)


def check_plan(loaded: WithData, plan: Plan) -> None:
    """Every row of what runs together, with the model's, the data's and the job's facts (before any group for a
    written plan)."""
    workload = loaded.workload()
    check(Setup(plan, loaded.cfg.train, loaded.model_facts(), workload.data_facts(), loaded.job.facts))


def with_train(cfg: RecipeConfig, **chosen: Any) -> RecipeConfig:
    """``cfg`` with train options resolved (``objective``, ``method``, ``compile``, ``fp8``: what checkpoints and the
    saved recipe record)."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **chosen))
