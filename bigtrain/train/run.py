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

from bigtrain.checkpoint.adapter_export import export_adapter
from bigtrain.checkpoint.base_model import check_base
from bigtrain.checkpoint.export import export_model
from bigtrain.checkpoint.layout import RECIPE, Manifest
from bigtrain.checkpoint.loader import load_checkpoint
from bigtrain.checkpoint.lock import OutputDirLock
from bigtrain.checkpoint.run_dir import FINAL_ADAPTER, FINAL_MODEL, plan_start, prepare_output_dir
from bigtrain.checkpoint.saver import Checkpointer
from bigtrain.checkpoint.storage import is_disk_full, storage_problem
from bigtrain.config.capabilities import ModelFacts, Setup, check
from bigtrain.config.hf import resolve_attention
from bigtrain.config.load import dump_recipe, load_recipe, recipe_warnings
from bigtrain.config.plan import Plan
from bigtrain.config.resolve import parallel_of, resolve_plan
from bigtrain.config.schema import ADAPTER_METHODS, RecipeConfig
from bigtrain.config.tasks import task_of
from bigtrain.config.workload import Workload
from bigtrain.data.for_task import load_training_data
from bigtrain.data.loader import EvalLoader, StepLoader
from bigtrain.data.order import GlobalOrder
from bigtrain.data.preference import PreferencePairs
from bigtrain.data.processor import pixel_budget
from bigtrain.engine import Engine, build_engine, build_options
from bigtrain.errors import CheckpointNotWritten, ConfigError
from bigtrain.models.build import load_hf_config, model_shapes
from bigtrain.parallel.transforms.adapters import trained_shapes
from bigtrain.parallel.transforms.base import BuildOptions
from bigtrain.planner.auto import choose_plan, local_cluster, predict
from bigtrain.planner.explain import describe
from bigtrain.planner.profile import load_profile
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
from bigtrain.train.checks import (
    check_enough_rows,
    check_offload_host_memory,
    check_packed_attention,
    check_writable,
)
from bigtrain.train.loop import StartPoint, TrainLoop, TrainResult
from bigtrain.train.metrics import format_bytes
from bigtrain.train.optim import build_optimizer, build_scheduler
from bigtrain.train.reference_pass import attach_precomputed
from bigtrain.train.replica_groups import ReplicaGroup, job_world
from bigtrain.train.task_setup import check_model_against_rows, prepare_task, with_images
from bigtrain.train.trackers import check_tracker

log = logging.getLogger("bigtrain")
DATA_BOUND_SHARE = 0.25  # of the run's time spent waiting for data, above which the summary says so


def run_training(cfg: RecipeConfig, replica_group: ReplicaGroup | None = None) -> TrainResult:
    job = TrainingJob(cfg, replica_group=replica_group)
    ended = False
    try:
        with job:
            result = job.fit()
        if job.env.rank == 0:
            write_final_model(cfg, result)
        ended = True
    finally:
        # output_dir is the run's until its final model is written; a clean end leaves no lock file behind
        job.output_lock.release(remove=ended)
    return result


def write_final_model(cfg: RecipeConfig, result: TrainResult) -> None:
    """Rank 0: the finished run's last checkpoint as an HF folder in output_dir/model, or for an adapter run as
    peft's adapter folder in output_dir/adapter (unless opted out)."""
    if not cfg.checkpoint.save_final_model or result.stopped or result.checkpoint is None:
        return
    adapters = cfg.train.method in ADAPTER_METHODS
    out = Path(cfg.output_dir) / (FINAL_ADAPTER if adapters else FINAL_MODEL)
    try:
        (export_adapter if adapters else export_model)(result.checkpoint, out)
    except Exception as e:  # an OSError, or safetensors' own SafetensorError (not an OSError) for a full disk
        if not is_disk_full(e, out):
            raise
        raise CheckpointNotWritten(
            f"the final model could not be written to {out}: {storage_problem(e, out)}; the last checkpoint "
            f"{result.checkpoint} holds it: free space, then bigtrain export-model {result.checkpoint} -o {out}"
        ) from e
    log.info("final %s (step %d) written to %s", "adapter" if adapters else "model", result.last_step, out)


def _with_train(cfg: RecipeConfig, **chosen: Any) -> RecipeConfig:
    """``cfg`` with train options resolved (``method``, ``compile``, ``fp8``: what checkpoints and the saved recipe
    record)."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **chosen))


class TrainingJob:
    """Validates on construction; ``with`` starts the process group, plans and builds the engine; ``fit`` trains;
    leaving the block tears the group down (after every rank has finished, when nothing failed)."""

    def __init__(
        self, cfg: RecipeConfig, env: LaunchEnv | None = None, replica_group: ReplicaGroup | None = None
    ) -> None:
        self.cfg = cfg
        self.env = env or read_launch_env()
        self.replica_group = replica_group  # this job is one replica group of the run (train/replica_groups.py)
        warn_if_accelerate_started_one_process(self.env)
        self.hf_config = load_hf_config(cfg.model)
        # attn_implementation auto: the family's own default (the recipe keeps "auto", as written: it is what a
        # restart compares); the checks below need the implementation that will run
        self.attention = resolve_attention(self.hf_config, cfg.model.attn_implementation)
        auto = cfg.parallel.plan == "auto"
        self.device = pick_device(self.env)
        world = job_world(self.env.world_size, replica_group)
        self.plan: Plan | None = None if auto else resolve_plan(cfg.parallel, world, cfg.train)
        self.task = task_of(self.hf_config)
        self._packed = False  # packed documents (token rows only)
        self.data, self.eval_data = load_training_data(cfg, self.hf_config, self.task)
        cfg, label_note = prepare_task(cfg, self.hf_config, self.task, self.data)
        self.cfg = cfg
        packing_note = None if self.task.examples else self._check_token_rows()
        check_enough_rows(self.data.num_rows, self._batch, cfg.data.path)
        check_writable(cfg.output_dir)
        check_tracker(cfg.train.log_to)
        if self.env.rank == 0:
            notes = [note for note in (packing_note, label_note) if note]
            for warning in recipe_warnings(cfg) + self._data_warnings() + notes:
                log.warning("%s", warning)
        self.start = plan_start(cfg)
        if self.start.resume_from is not None:
            resume_from = self.start.resume_from
            if cfg.train.method == "auto":  # a resumed run keeps the method its checkpoint was trained with
                self.cfg = cfg = _with_train(cfg, method=load_recipe(resume_from / RECIPE).train.method)
            if "auto" in (cfg.train.compile, cfg.train.fp8):  # and the compile and FP8 choices
                saved = load_recipe(resume_from / RECIPE).train
                self.cfg = cfg = _with_train(cfg, compile=saved.compile, fp8=saved.fp8)
            # an adapter checkpoint names its base: still the same files?
            check_base(cfg.model.name_or_path, Manifest.read(resume_from).base, f"resuming from {resume_from}")
        # plan: auto and method: auto are chosen at start-up, together, for the memory the job really has
        choose = self.plan is None or "auto" in (cfg.train.method, cfg.train.compile, cfg.train.fp8)
        self.options: BuildOptions | None = None if choose else self._build_options(self.plan)
        self.output_lock = OutputDirLock(cfg.output_dir)
        self.engine: Engine | None = None
        self.checkpointer: Checkpointer | None = None
        self.start_point = StartPoint()

    @property
    def _batch(self) -> int:
        return self.cfg.train.global_batch_size

    def _data_warnings(self) -> list[str]:
        out = []
        held = self.eval_data if self.cfg.data.eval_path is not None else None  # a held-out fraction: counted once
        for key, data in (("data.path", self.data), ("data.eval_path", held)):
            if data is not None and data.truncated:
                out.append(
                    f"{key}: {data.truncated} of {data.examples} records are longer than data.seq_len="
                    f"{self.cfg.data.seq_len} and were cut; what follows the cut is never trained on (raise "
                    "data.seq_len)"
                )
            if data is not None and getattr(data, "resized", 0):
                low, high = pixel_budget(data.processor.image_processor) or (0, 0)
                out.append(
                    f"{key}: {data.resized} images are outside the pixel budget (data.min_pixels={low}, "
                    f"data.max_pixels={high}): the processor resizes them into it"
                )
        return out

    def _image_processor(self) -> dict[str, Any] | None:
        """An image classifier's preprocessing, saved with its checkpoints and final model."""
        preprocessing = getattr(self.data, "preprocessing", None)
        if preprocessing is None:
            return None
        return {"size": preprocessing.size, "mean": preprocessing.mean, "std": preprocessing.std}

    def _check_token_rows(self) -> str | None:
        """A causal LM's checks of its model against its rows (before any process group); returns the note on
        packed documents, if any."""
        check_model_against_rows(self.cfg, self.hf_config, self.data.seq_len, is_main=self.env.rank == 0)
        held_out = self.eval_data.positions if self.eval_data is not None else None
        self._packed = self.data.positions is not None or held_out is not None
        # context parallelism cannot keep packed records apart yet (_build_options)
        return check_packed_attention(self.hf_config, self.attention) if self._packed else None

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
            self._log_plan()
            train = self.cfg.train
            self.engine = build_engine(
                self.options,
                train,
                make_optimizer=lambda params: build_optimizer(params, train),
                make_scheduler=lambda optimizer: build_scheduler(optimizer, train),
            )
            data_info = {"path": self.cfg.data.path, "rows": self.data.num_rows, "seq_len": self.data.seq_len}
            data_info.update(shuffle=self.cfg.data.shuffle, seed=train.seed)
            resuming = self.start.resume_from is not None  # dpo/ipo's precomputed reference: before any resume
            attach_precomputed(self.cfg, self.plan, self.engine, [self.data, self.eval_data], resuming, self.device)
            self.checkpointer = Checkpointer(
                self.cfg, self.plan, self.hf_config, self.engine, data_info, self.device, self._image_processor()
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
        assert self.engine is not None and self.plan is not None, "use TrainingJob as a context manager"
        cfg = self.cfg
        costs = getattr(self.data, "row_costs", None)  # rows of unequal cost (images) are dealt, not sliced
        order = GlobalOrder(self.data.num_rows, self._batch, cfg.data.shuffle, cfg.train.seed, costs)
        engine, micro = self.engine, self.plan.micro_batch_size
        cp_rank, cp_size = engine.sequence_slice
        slices = dict(cp_rank=cp_rank, cp_size=cp_size)
        loader = StepLoader(
            self.data,
            engine.dp_rank,
            engine.dp_size,
            micro,
            self.device,
            order=order,
            count=engine.objective.count,
            workers=cfg.data.workers,
            steps=cfg.train.steps,
            **slices,
        )
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
                **slices,
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
            unit=self.task.unit,
        )
        result = loop.run()
        if self.env.rank == 0:
            self._log_done(result)
        return result

    def _log_done(self, result: TrainResult) -> None:
        unit, cfg = self.task.unit, self.cfg
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
            ", ".join(format_bytes(p) for p in result.peak_mem_bytes),
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

    def _resume(self, folder: Path, data_info: dict[str, Any]) -> None:
        attn = self.cfg.model.attn_implementation
        if self.cfg.train.method in ADAPTER_METHODS:
            shapes = trained_shapes(self.hf_config, attn, self.cfg.lora)
        else:
            shapes = model_shapes(self.hf_config, attn)
        resumed = load_checkpoint(self.engine, folder, self.device, shapes)
        saved = resumed.manifest
        self.start_point = StartPoint(saved.step, saved.tokens)
        if self.env.rank != 0:
            return
        rng = "restored" if resumed.rng_restored else f"not restored (saved by {saved.world_size} ranks)"
        log.info(
            "resumed from %s: step %d, saved by %d rank(s) with plan %s; RNG %s",
            folder,
            saved.step,
            saved.world_size,
            saved.plan,
            rng,
        )
        changed = [k for k in ("rows", "seq_len") if saved.data.get(k) != data_info[k]]
        if changed:
            log.warning(
                "the data changed since the checkpoint (%s): the steps after it read another order than the saved run",
                ", ".join(f"{k} {saved.data.get(k)} -> {data_info[k]}" for k in changed),
            )

    def _auto_plan(self, free: int) -> Plan:
        """Plan from the hardware this job really has (``free``: the most constrained rank's free memory); every
        rank gets the same numbers, hence the same plan."""
        device = self.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        cfg = self.cfg
        choice = choose_plan(
            self._model_config(),
            self.env.world_size,
            self.env.local_world_size,
            name,
            free,
            self._workload(),
            load_profile(cfg.parallel.hardware_profile) if cfg.parallel.hardware_profile else None,
            fixed=None if self.plan is None else self.plan.to_dict(),  # method: auto with a written plan
            host_memory_bytes=psutil.virtual_memory().available,
        )
        chose = " and ".join(
            [f"train.method={choice.method}"] * (cfg.train.method == "auto")
            + [f"train.compile={str(choice.compile).lower()}"] * (cfg.train.compile == "auto")
            + [f"train.fp8={choice.fp8}"] * (cfg.train.fp8 == "auto")
            + ["the plan"] * (self.plan is None)
        )
        if self.env.rank == 0:
            log.info("auto chose %s:\n%s", chose, choice.table)
        if cfg.train.method == "auto":
            self.cfg = _with_train(cfg, method=choice.method)
        if "auto" in (cfg.train.compile, cfg.train.fp8):
            self.cfg = _with_train(self.cfg, compile=choice.compile, fp8=choice.fp8)
        # validated as if the user had written it, with the records' options the recipe writes (sync_batchnorm)
        chosen = {**choice.plan.to_dict(), **cfg.parallel.options}
        return resolve_plan(parallel_of(chosen), self.env.world_size, self.cfg.train)

    def _model_config(self) -> dict[str, Any]:
        """The model's config as the planner reads it (a dict naming its model_type)."""
        return {**self.hf_config.to_dict(), "model_type": self.hf_config.model_type}

    def _workload(self) -> Workload:
        """What one step processes, as the planner and the capability table's data rows read it."""
        cfg = self.cfg
        epochs = cfg.train.steps * self._batch / max(self.data.num_rows, 1)  # a precomputed reference's share
        workload = Workload.of_train(cfg.train, self.data.seq_len, cfg.lora, self._packed, self.attention, epochs)
        return with_images(workload, self.data, cfg)

    def _build_options(self, plan: Plan) -> BuildOptions:
        """The capability table's rows for this model and the engine's own inputs (its config files), checked on
        every rank before any process group for a written plan; then what the build reads."""
        workload = self._workload()
        check(Setup(plan, self.cfg.train, ModelFacts.of(self.hf_config), workload.data_facts()))
        dtype_bytes = workload.dtype_bytes
        free_host = psutil.virtual_memory().available
        check_offload_host_memory(
            plan, self.hf_config, self.data.seq_len, dtype_bytes, self.env.local_world_size, free_host
        )
        options = build_options(self.cfg, self.hf_config, plan, self.device)
        group = self.replica_group
        return options if group is None else group.options(options, self.cfg.train.collective_timeout_s)

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
            + (" pairs" if isinstance(self.data, PreferencePairs) else "")
            + f" = micro {plan.micro_batch_size} x dp {plan.dp} x accum {plan.grad_accum_steps(self._batch)}"
            f" | {self.data.description}"
            + (f" | eval: {self.eval_data.description}" if self.eval_data is not None else "")
            + (f" | {self._method_words()}" if self.cfg.train.method != "full" else "")
        )

    def _prediction(self, plan: Plan) -> str:
        """What the planner predicts for this plan on these devices (the plan line's check on the run)."""
        device = self.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        free = local_free_memory(self.env, device)
        cluster = local_cluster(self.env.world_size, self.env.local_world_size, name, free)
        return predict(self._model_config(), plan, cluster, self._workload())

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
