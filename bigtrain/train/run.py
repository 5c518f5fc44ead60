"""One rank's whole job: validate -> process group -> plan -> engine -> resume -> train -> summary -> final model.

Everything that can be wrong with the user's input is checked *before* the process group exists, identically on
every rank, so a bad recipe fails everywhere within seconds instead of leaving a peer waiting in a collective.

``run_training(cfg)`` is what ``bigtrain train`` runs; ``TrainingJob`` is the same as a context manager for code
that wants the engine after training (its state, its parameters) before the process group is torn down. The final
HF model is written by rank 0 from the last checkpoint after the group is gone: the other ranks are free to exit,
and a long export cannot hit a collective timeout.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist

from bigtrain.checkpoint.export import HfFiles
from bigtrain.checkpoint.loader import load_checkpoint
from bigtrain.checkpoint.lock import OutputDirLock
from bigtrain.checkpoint.run_dir import prepare_output_dir
from bigtrain.checkpoint.saver import Checkpointer
from bigtrain.config.load import dump_recipe, recipe_warnings
from bigtrain.config.plan import Plan
from bigtrain.config.resolve import parallel_of, resolve_plan
from bigtrain.config.schema import ADAPTER_METHODS, RecipeConfig
from bigtrain.data.loader import EvalLoader, StepLoader
from bigtrain.data.order import GlobalOrder
from bigtrain.engine import Engine, build_engine, build_options
from bigtrain.errors import ConfigError
from bigtrain.job import Job
from bigtrain.models.build import model_shapes
from bigtrain.parallel.transforms.adapters import trained_shapes
from bigtrain.parallel.transforms.base import BuildOptions
from bigtrain.planner.auto import local_cluster, predict
from bigtrain.planner.names import describe
from bigtrain.runtime import (
    LaunchEnv,
    as_launched,
    finish_collectives,
    init_process_group,
    local_free_memory,
    pick_device,
    read_launch_env,
    smallest_free_memory,
    warn_if_accelerate_started_one_process,
)
from bigtrain.train import elastic as elastic_run
from bigtrain.train import start_up
from bigtrain.train.checks import check_offload_host_memory
from bigtrain.train.elastic import Elastic
from bigtrain.train.final_model import write_final_model
from bigtrain.train.loop import StartPoint, TrainLoop, TrainResult
from bigtrain.train.metrics import format_bytes
from bigtrain.train.optim import build_optimizer, build_scheduler
from bigtrain.train.padding import trim_multiple
from bigtrain.train.replica_groups import ReplicaGroup, job_world

log = logging.getLogger("bigtrain")
DATA_BOUND_SHARE = 0.25  # of the run's time spent waiting for data, above which the summary says so


def run_training(
    cfg: RecipeConfig, replica_group: ReplicaGroup | None = None, elastic: Elastic | None = None
) -> TrainResult:
    job = TrainingJob(cfg, replica_group=replica_group, elastic=elastic)
    ended = False
    try:
        with job:
            result = job.fit()
        if job.env.rank == 0:
            write_final_model(job.cfg, result, job.job)
        ended = True
    finally:
        # output_dir is the run's until its final model is written; a clean end leaves no lock file behind
        job.output_lock.release(remove=ended)
    return result


class TrainingJob:
    """Runs start-up's phases that need no process group on construction (``start_up.py``: resolve, data, start, a
    written plan, all checked on every rank); ``with`` starts the process group, plans ``auto`` and builds the engine;
    ``fit`` trains; leaving the block tears the group down (after every rank has finished, when nothing failed)."""

    def __init__(
        self,
        cfg: RecipeConfig,
        env: LaunchEnv | None = None,
        replica_group: ReplicaGroup | None = None,
        elastic: Elastic | None = None,
    ) -> None:
        self.env = env or read_launch_env()
        self.replica_group = replica_group  # this job is one replica group of the run (train/replica_groups.py)
        self.elastic = elastic  # a worker of an elastic run: re-planned where the written plan does not run here
        warn_if_accelerate_started_one_process(self.env)
        self.device = pick_device(self.env)
        if elastic is not None:  # before the process group: NCCL would meet an unusable device there first
            elastic_run.check_device(self.device)
        is_main = self.env.rank == 0
        resolved = start_up.resolve(cfg)
        world = job_world(self.env.world_size, replica_group)
        # an elastic restart may re-plan; its first start runs the recipe as written
        replans = elastic if elastic is not None and elastic.may_replan(resolved.cfg) else None
        # a written plan is checked before the data is read (its arithmetic and the job's rows); again with the data
        elastic_run.written_or_replanned(lambda: start_up.written_plan(resolved.cfg, resolved.job, world), replans)
        loaded, self.start = start_up.start(start_up.read(resolved, is_main))
        if is_main:
            for warning in recipe_warnings(loaded.cfg) + list(loaded.notes):
                log.warning("%s", warning)
        self.loaded = loaded
        written = lambda: start_up.written_plan(loaded.cfg, loaded.job, world)  # noqa: E731
        self.plan: Plan | None
        # replanned: why the recipe's plan cannot run on this world (None: it can)
        self.plan, self.replanned = elastic_run.written_or_replanned(written, replans)
        train = loaded.cfg.train
        # plan: auto and method: auto are chosen at start-up, together, for the memory the job really has
        choose = self.plan is None or "auto" in (train.method, train.compile, train.fp8)
        self.options: BuildOptions | None = None if choose else self._build_options(self.plan)
        start_up.check_final_adapter(loaded.cfg)
        self.output_lock = OutputDirLock(loaded.cfg.output_dir)
        self.engine: Engine | None = None
        self.checkpointer: Checkpointer | None = None
        self.start_point = StartPoint()
        self._resumed_source: str | None = None  # a step source's state from the checkpoint resumed

    @property
    def cfg(self) -> RecipeConfig:
        """The recipe as this run records it (its objective resolved, what a resume or the planner chose)."""
        return self.loaded.cfg

    @property
    def hf_config(self) -> Any:
        return self.loaded.hf_config

    @property
    def job(self) -> Job:
        return self.loaded.job

    @property
    def data(self) -> Any:
        return self.loaded.data

    @property
    def eval_data(self) -> Any:
        return self.loaded.held_out

    @property
    def _batch(self) -> int:
        return self.cfg.train.global_batch_size

    def __enter__(self) -> TrainingJob:
        self._launched = as_launched(self.env)  # the launcher's variables a library may read, for the job's life
        self._launched.__enter__()
        # a job inside a process group its caller already started (a script that trains several recipes in one
        # launch) runs in that group and leaves it standing; otherwise the job starts and ends its own
        self._owns_group = not dist.is_initialized()
        try:
            if self._owns_group:
                init_process_group(self.env, self.device, self.cfg.train.collective_timeout_s)
            elif (dist.get_rank(), dist.get_world_size()) != (self.env.rank, self.env.world_size):
                raise ConfigError(
                    f"the process group already started here is rank {dist.get_rank()} of {dist.get_world_size()}, "
                    f"but the launcher says rank {self.env.rank} of {self.env.world_size}; start the job in a fresh "
                    "process"
                )
        except BaseException:
            self._launched.__exit__(None, None, None)
            raise
        try:
            self._hold_output_dir()
            if self.env.rank == 0:
                prepare_output_dir(self.start, self.cfg)
                if self.start.note:
                    log.info("%s", self.start.note)
            if self.options is None:
                self.plan = self._auto_plan(smallest_free_memory(self.env, self.device))
                self.options = self._build_options(self.plan)
            assert self.options is not None
            if self.replanned is not None and self.start.resume_from is None and self.env.rank == 0:
                line = elastic_run.replan_line(None, self.plan, self.env.world_size, self._prediction, self.replanned)
                log.warning("%s", line)
            self._log_plan()
            train, objective, task = self.cfg.train, self.job.objective, self.job.task
            self.engine = build_engine(
                self.options,
                train,
                make_optimizer=lambda params: build_optimizer(params, train),
                make_scheduler=lambda optimizer: build_scheduler(optimizer, train),
                objective=objective.make,
                roles=objective.attach,
            )
            streamed = getattr(self.data, "streamed", False)
            rows = "streamed" if streamed else self.data.num_rows
            data_info = {"path": self.cfg.data.path, "rows": rows, "seq_len": self.data.seq_len}
            data_info.update(shuffle=self.cfg.data.shuffle, seed=train.seed)
            if objective.before_training is not None:  # a precomputed reference: before any resume
                datasets = [self.data, self.eval_data]
                resuming = self.start.resume_from is not None
                objective.before_training(self.cfg, self.plan, self.engine, datasets, resuming, self.device)
            files = task.export_files(self.cfg, self.hf_config, self.data) if task.export_files else HfFiles()
            # a stream's position after step k is where step k + 1's rows begin
            position = (lambda step: self.data.state_at(step * self._batch)) if streamed else None
            self.checkpointer = Checkpointer(
                self.cfg, self.plan, self.hf_config, self.engine, data_info, self.device, files, position
            )
            if self.start.resume_from is not None:
                self._resume(self.start.resume_from, data_info)
        except BaseException:
            # as in __exit__: drop the sharded modules and collect their cycles while the group is alive, or gloo's
            # threads may free their tensors after Python is gone and abort the process that is reporting the error
            self.engine = self.checkpointer = None
            gc.collect()
            self._end_group()
            self.output_lock.release()
            self._launched.__exit__(None, None, None)
            raise
        return self

    def _hold_output_dir(self) -> None:
        """Rank 0 takes output_dir for the run's whole life before anything in it is touched; every rank hears
        whether another run holds it, and all refuse together (nothing of the other run is moved or written).
        What this start would do there (``plan_start``) was decided from the files before, and is moot if refused."""
        holder = [self.output_lock.acquire() if self.env.rank == 0 else None]
        dist.broadcast_object_list(holder, src=0)
        if holder[0] is not None:
            raise ConfigError(
                f"output_dir {self.cfg.output_dir} is in use by another run ({holder[0]}); wait for it to finish or "
                "stop it, or use another output_dir"
            )

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.engine is not None:
            self.engine.close()
        self.engine = self.checkpointer = None
        try:
            if exc_type is None:
                # Sharded modules sit in reference cycles that hold the process group's pending async work:
                # collected now, then every collective finished, before the group is torn down.
                gc.collect()
                finish_collectives()
        finally:
            self._end_group()
            self._launched.__exit__(None, None, None)

    def _end_group(self) -> None:
        if self._owns_group:
            dist.destroy_process_group()

    def fit(self) -> TrainResult:
        assert self.engine is not None and self.plan is not None and self.checkpointer is not None, (
            "use TrainingJob as a context manager"
        )
        cfg = self.cfg
        engine, micro = self.engine, self.plan.micro_batch_size
        made = self.job.objective.step_source
        if made is not None:  # batches made during training (rollouts): their state goes into checkpoints
            loader = made(cfg, self.plan, engine, self.data, self.device, self._resumed_source)
            self.checkpointer.step_source_state = loader.state
        else:
            loader = self._step_loader(engine, micro)
        evaluation = None
        if self.eval_data is not None:
            evaluation = EvalLoader(
                self.eval_data,
                engine.dp_rank,
                engine.dp_size,
                micro,
                self.device,
                global_batch_size=self._batch,
                count=engine.objective.count,
                **self._reading(engine),
            )
        loop = TrainLoop(
            cfg,
            self.plan,
            engine,
            loader,
            self.data.seq_len,
            self.device,
            self.checkpointer,
            self.start_point,
            evaluation,
            unit=self.job.task.unit,
            rows_per_example=self.job.objective.rows_per_example,
            shown=self.job.shown_metrics,
            before_step=None if self.elastic is None else lambda step: self.elastic.before_step(self.env.rank, step),
        )
        result = loop.run()
        if self.env.rank == 0:
            self._log_done(result)
        return result

    def _step_loader(self, engine: Engine, micro: int) -> StepLoader:
        """Each step's micro-batches of this rank, read from the data in the global order."""
        cfg = self.cfg
        shuffle = cfg.data.shuffle and not getattr(self.data, "self_ordered", False)  # a blend orders itself
        order = GlobalOrder.of_rows(self.data, self._batch, shuffle, cfg.train.seed)
        return StepLoader(
            self.data,
            engine.dp_rank,
            engine.dp_size,
            micro,
            self.device,
            order=order,
            count=engine.objective.count,
            workers=cfg.data.workers,
            steps=cfg.train.steps,
            **self._reading(engine),
        )

    def _reading(self, engine: Engine) -> dict[str, int]:
        """How this rank cuts the rows it reads: its context-parallel slice of each, and the padding trimmed."""
        cp_rank, cp_size = engine.sequence_slice
        trim = trim_multiple(self.data, self.plan, self.cfg.train, self.hf_config)
        return dict(cp_rank=cp_rank, cp_size=cp_size, trim_to=trim)

    def _log_done(self, result: TrainResult) -> None:
        unit, cfg = self.job.task.unit, self.cfg
        log.info(
            "done: %d steps (now at step %d), %s %s in %.1f s (%s %s/s); %s per rank: %s; outputs in %s",
            result.steps,
            result.last_step,
            f"{result.tokens:,}",
            unit,
            result.seconds,
            f"{result.tokens / result.seconds:,.0f}",
            unit,
            result.peak_mem_kind,
            ", ".join(format_bytes(p) for p in result.peak_mem_bytes)
            + (f"; {shown}" if (shown := ", ".join(f"{k} {v:.4g}" for k, v in result.metrics.items())) else ""),
            cfg.output_dir,
        )
        share = result.data_seconds / max(result.seconds, 1e-9)
        if share > DATA_BOUND_SHARE:  # the steps waited for their data: the loader, not the device, set the pace
            log.warning(
                "the steps waited for their data %.0f%% of the time (data_s in metrics.jsonl): reading limits this "
                "run; raise data.workers (now %d) to read the next steps while one trains",
                100 * share,
                cfg.data.workers,
            )

    def _resume_stream(self, saved: str | None, step: int) -> tuple[bool, str]:
        """The stream opened at the checkpoint's position: whether it applied, and the line that says so."""
        position = step * self._batch
        if saved is None:  # a checkpoint of indexed data: the stream is read from its start up to the step
            return False, (
                f"the checkpoint holds no stream position: the stream is read from its start to row {position}"
            )
        return self.data.restore(saved, position)

    def _resume(self, folder: Path, data_info: dict[str, Any]) -> None:
        attn = self.cfg.model.attn_implementation
        if self.cfg.train.method in ADAPTER_METHODS:
            shapes = trained_shapes(self.hf_config, attn, self.cfg.lora)
        else:
            shapes = model_shapes(self.hf_config, attn)
        resumed = load_checkpoint(self.engine, folder, self.device, shapes)
        saved = resumed.manifest
        self.start_point = StartPoint(saved.step, saved.tokens)
        self._resumed_source = resumed.step_source
        # a stream is opened where the checkpoint's next step begins (every rank); its line follows the resume's
        stream_line = self._resume_stream(resumed.stream, saved.step) if getattr(self.data, "streamed", False) else None
        if self.env.rank != 0:
            return
        rng = "restored" if resumed.rng_restored else f"not restored (saved by {saved.world_size} ranks)"
        log.info("resumed from %s: step %d, saved by %d rank(s) with plan %s; RNG %s", folder, saved.step,
                 saved.world_size, elastic_run.plan_words(saved.plan), rng)  # fmt: skip
        changed = [k for k in ("rows", "seq_len") if saved.data.get(k) != data_info[k]]
        if changed:
            log.warning(
                "the data changed since the checkpoint (%s): the steps after it read another order than the saved run",
                ", ".join(f"{k} {saved.data.get(k)} -> {data_info[k]}" for k in changed),
            )
        if stream_line is not None:
            log.log(logging.INFO if stream_line[0] else logging.WARNING, "%s", stream_line[1])
        if self.elastic is not None and self.plan is not None:
            out, lost_at = self.cfg.output_dir, self.elastic.lost_at
            world = job_world(self.env.world_size, self.replica_group)
            line = elastic_run.replan_line(saved, self.plan, world, self._prediction, self.replanned, out, lost_at)
            if line is not None:
                log.warning("%s", line)

    def _choose(self, free: int, world: int) -> Any:
        """The planner's choice for ``world`` ranks of this hardware (``free``: the most constrained rank's free
        memory): every rank gets the same numbers, hence the same plan."""
        device = self.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        from bigtrain.planner.auto import choose_plan  # the search: imported only where the job plans
        from bigtrain.planner.profile import load_profile

        cfg = self.cfg
        workload = self.loaded.workload()
        return choose_plan(
            self._planned(workload),
            world,
            min(self.env.local_world_size, world),
            name,
            free,
            workload,
            load_profile(cfg.parallel.hardware_profile) if cfg.parallel.hardware_profile else None,
            fixed=None if self.plan is None else self.plan.to_dict(),  # method: auto with a written plan
            host_memory_bytes=psutil.virtual_memory().available,
        )

    def _auto_plan(self, free: int) -> Plan:
        """Plan from the hardware this job really has (an elastic run that no plan fits here: the ranks that would
        run one, in one line)."""
        cfg = self.cfg
        if self.elastic is None:
            choice = self._choose(free, self.env.world_size)
        else:
            env = self.env
            node = env.local_world_size if env.world_size > env.local_world_size else 1  # whole nodes across nodes
            choice = elastic_run.planned_or_stop(lambda n: self._choose(free, n), env.world_size, cfg.output_dir, node)
        chose = " and ".join(
            [f"train.method={choice.method}"] * (cfg.train.method == "auto")
            + [f"train.compile={str(choice.compile).lower()}"] * (cfg.train.compile == "auto")
            + [f"train.fp8={choice.fp8}"] * (cfg.train.fp8 == "auto")
            + ["the plan"] * (self.plan is None)
        )
        if self.env.rank == 0 and self.replanned is None:  # an elastic re-plan says one line after the resume
            log.info("auto chose %s:\n%s", chose, choice.table)
        chosen_train = {k: getattr(choice, k) for k in ("method", "compile", "fp8") if getattr(cfg.train, k) == "auto"}
        if chosen_train:  # the run records what the planner chose
            self.loaded = dataclasses.replace(self.loaded, cfg=start_up.with_train(cfg, **chosen_train))
            start_up.check_final_adapter(self.cfg)  # method: auto chose adapters for a model without a folder
        # validated as if the user had written it, with the records' options the recipe writes (sync_batchnorm)
        chosen = {**choice.plan.to_dict(), **cfg.parallel.options}
        return resolve_plan(parallel_of(chosen), self.env.world_size, self.cfg.train, self.job.facts)

    def _planned(self, workload: Any) -> Any:
        """The job's model as the planner weighs it (its task's statistics and terms)."""
        model_config = {**self.hf_config.to_dict(), "model_type": self.hf_config.model_type}
        return self.job.task.planner(model_config, workload)

    def _build_options(self, plan: Plan) -> BuildOptions:
        """The capability table's rows for this model, data and job, and the engine's own inputs (its config
        files), checked on every rank before any process group for a written plan; then what the build reads."""
        start_up.check_plan(self.loaded, plan)
        dtype_bytes = self.loaded.workload().dtype_bytes
        free_host = psutil.virtual_memory().available
        check_offload_host_memory(
            plan, self.hf_config, self.data.seq_len, dtype_bytes, self.env.local_world_size, free_host
        )
        options = build_options(self.cfg, self.hf_config, plan, self.device, self.loaded.new_head)
        group, timeout_s = self.replica_group, self.cfg.train.collective_timeout_s
        return options if group is None else group.options(options, timeout_s, self.elastic is not None)

    def _log_plan(self) -> None:
        if self.env.rank == 0:
            log.info("%s", self.plan_line())

    def plan_line(self) -> str:
        plan = self.plan
        assert plan is not None
        env = self.env
        nodes = max(1, env.world_size // max(1, env.local_world_size))
        group = f" ({self.replica_group})" if self.replica_group else ""
        where = f"{env.world_size} rank(s){group} on {self.device.type}" + (
            f", {nodes} nodes x {env.local_world_size}" if nodes > 1 else ""
        )
        return (
            f"plan {describe(plan)} ({self._prediction(plan)}) | {where} | global batch {self._batch}"
            + (f" {self.job.objective.batch_noun}" if self.job.objective.batch_noun else "")
            + f" = micro {plan.micro_batch_size} x dp {plan.dp} x accum {plan.grad_accum_steps(self._batch)}"
            f" | {self.data.description}"
            + (f" | eval: {self.eval_data.description}" if self.eval_data is not None else "")
            + (f" | {self._method_words()}" if self.cfg.train.method != "full" else "")
        )

    def _prediction(self, plan: Plan, world: int | None = None) -> str:
        """What the planner predicts for this plan on these devices (the plan line's check on the run), on ``world``
        of them (the plan a checkpoint was saved with: its own)."""
        device = self.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        free = local_free_memory(self.env, device)
        world = world or self.env.world_size
        cluster = local_cluster(world, min(self.env.local_world_size, world), name, free)
        workload = self.loaded.workload()
        return predict(self._planned(workload), plan, cluster, workload)

    def _method_words(self) -> str:
        lora = self.cfg.lora
        base = "a 4-bit NF4 base" if self.cfg.train.method == "qlora" else "a frozen base"
        return f"{self.cfg.train.method}: adapters of rank {lora.r} (alpha {lora.alpha:g}) on {base}"

    def dry_run(self) -> str:
        """Everything a start checks, without a process group, an engine or a file written: the resolved recipe and
        the plan (``plan: auto`` plans for this machine's free memory, as every rank of a real start would)."""
        if self.options is None:
            self.plan = self._auto_plan(local_free_memory(self.env, self.device))
            self.options = self._build_options(self.plan)
        return f"{dump_recipe(self.cfg)}\n{self.plan_line()}\nnothing trained (--dry-run)"
