"""The training loop. It talks to an engine and nothing else: it never learns how the model is parallelised.

Each optimizer step: this rank's micro-batches from the loader -> the predicted-token count of the whole global
batch (summed over data-parallel ranks before any backward, because it scales every token's loss) -> the engine's
``train_step`` -> evaluation on the held-out rows when due -> log -> checkpoint when due, at the end, or when SIGTERM
asks the run to stop.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from bigtrain.checkpoint.saver import Checkpointer
from bigtrain.config.load import recipe_to_dict
from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.data.loader import EvalLoader, StepLoader
from bigtrain.engine.base import Engine, train_step
from bigtrain.errors import TrainingDiverged
from bigtrain.train.metrics import MetricsWriter, Progress, peak_memory_bytes
from bigtrain.train.preemption import StopOnSignal
from bigtrain.train.trackers import open_tracker

log = logging.getLogger("bigtrain")


@dataclass
class TrainResult:
    steps: int  # optimizer steps run by this start (a resumed run counts from its checkpoint)
    last_step: int  # the step the model has reached
    tokens: int  # tokens trained on by this start
    seconds: float
    peak_mem_bytes: list[int]  # one per rank
    peak_mem_kind: str
    stopped: signal.Signals | None  # the signal (SIGTERM, Ctrl-C's SIGINT) that ended the run early, after a checkpoint
    checkpoint: Path | None  # the last checkpoint published (rank 0; None on other ranks)
    data_seconds: float = 0.0  # of ``seconds``, rank 0's steps waiting for their data (data.workers reads ahead)
    metrics: dict[str, float] = field(default_factory=dict)  # the latest value of each shown metric (rank 0)


@dataclass(frozen=True)
class StartPoint:
    """Where the loop begins: step 0, or what a checkpoint restored."""

    step: int = 0
    tokens: int = 0  # tokens trained on before ``step``


def check_finite(record: dict, lr: float) -> None:
    """Stop at a non-finite loss or gradient norm: every later step would train on NaN.

    Every rank holds the same loss and norm (both reduced over the ranks), so every rank stops at the same step, and
    before that step's checkpoint: the last checkpoint written stays the last good one. An fp16 step whose gradients
    overflowed was skipped by the loss scaler, which then lowers its scale: that is not divergence.
    """
    if record.get("skipped"):
        return
    bad = [k for k in ("loss", "grad_norm") if not math.isfinite(record[k])]
    if bad:
        values = ", ".join(f"{k}={record[k]}" for k in bad)
        raise TrainingDiverged(
            f"step {record['step']}: {values}; training stopped (the last checkpoint, if any, is from before this "
            f"step). Lower train.lr (now {lr:g}), keep train.grad_clip on, or use bf16 instead of fp16"
        )


class TrainLoop:
    def __init__(
        self,
        cfg: RecipeConfig,
        plan: Plan,
        engine: Engine,
        loader: StepLoader,
        seq_len: int,
        device: torch.device,
        checkpointer: Checkpointer,
        start: StartPoint,
        eval_loader: EvalLoader | None = None,
        unit: str = "tokens",
        rows_per_example: int = 1,
        shown: tuple[str, ...] = (),
        before_step: Callable[[int], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.plan = plan
        self.engine = engine
        self.loader = loader
        self.seq_len = seq_len
        self.device = device
        self.checkpointer = checkpointer
        self.start = start
        self.eval_loader = eval_loader
        self.unit = unit  # what throughput counts (the task's): tokens, images or examples per second
        self.rows_per_example = rows_per_example  # rows a counted example takes (the objective's: a pair is 2)
        self.shown = shown  # metrics the bar and the last line show (Job.shown_metrics)
        self.before_step = before_step  # called with each step (1-based) before it runs: an elastic run's drill
        self.is_main = dist.get_rank() == 0

    def run_step(self, step: int) -> dict:
        """One optimizer step (0-based ``step``); returns its metrics record (``data_s``: the wait for its data)."""
        if self.before_step is not None:  # an elastic run's drill: a rank that leaves for good
            self.before_step(step + 1)
        t0 = time.perf_counter()
        batch = self.loader(step)
        waited = time.perf_counter() - t0 - batch.computed_s
        global_tokens = self.engine.data_parallel_sum(batch.tokens)
        sums, result = train_step(self.engine, batch.micro_batches, global_tokens, self.cfg.train.grad_clip)
        sums = sums.reshape(-1).cpu()  # the loss sum, then the objective's metric sums (preference rewards)
        record = {
            "step": step + 1,
            "loss": float(sums[0]) / max(global_tokens, 1),  # a batch without labels: 0, as train_step computes
            "grad_norm": float(result.grad_norm),
            "lr": result.lr,
            "data_s": waited,
            **self.engine.objective.step_metrics(sums[1:], global_tokens),
            **batch.metrics,
        }
        if batch.trained_tokens:
            record["_tokens"] = batch.trained_tokens
        if result.loss_scale is not None:
            record.update(loss_scale=result.loss_scale, skipped=result.skipped)
            if result.skipped:
                log.warning(
                    "step %d: fp16 gradients overflowed (loss scale %g); step skipped", step + 1, result.loss_scale
                )
        return record

    def eval_due(self, step: int) -> bool:
        """After every ``train.eval_every`` steps and after the last (``step`` counts steps done)."""
        every = self.cfg.train.eval_every
        return self.eval_loader is not None and (step == self.cfg.train.steps or (every > 0 and step % every == 0))

    def evaluate(self) -> dict:
        """The loss per labelled held-out token or example (all of them, every rank's share) and the objective's
        metrics: perplexity for a causal LM; accuracy, top-5 accuracy and macro-F1 for a classifier."""
        assert self.eval_loader is not None
        sums: torch.Tensor | None = None
        count = 0
        for batch in self.eval_loader:
            count += self.engine.held_out_sum(batch.tokens)
            part = self.engine.eval_sums(batch.micro_batches).cpu()
            sums = part if sums is None else sums + part
        assert sums is not None, "the held-out data gives at least one batch"
        if count == 0:  # every held-out row's labels are ignored (prompts cut by seq_len): no number to report
            log.warning("evaluation: the held-out data holds nothing labelled; eval_loss is null")
            return {"eval_loss": math.nan, **self.engine.objective.eval_metrics(math.nan, sums[1:], 0)}
        loss = float(sums[0]) / count
        return {"eval_loss": loss, **self.engine.objective.eval_metrics(loss, sums[1:], count)}

    def run(self) -> TrainResult:
        cfg, checkpointer = self.cfg, self.checkpointer
        total = cfg.train.steps
        tokens_per_step = cfg.train.global_batch_size * self.rows_per_example * self.seq_len
        joined = self.engine.join(self.start.step)  # a replica group behind the others takes their state and step
        if joined != self.start.step:
            self.start = StartPoint(joined, joined * tokens_per_step)
        writer = MetricsWriter(
            cfg.output_dir,
            enabled=self.is_main,
            keep_through_step=self.start.step,
            tracker=open_tracker(cfg.train.log_to, cfg.output_dir, recipe_to_dict(cfg), self.start.step)
            if self.is_main
            else None,
        )
        writer.write_plan(self.plan)
        progress = Progress(total, self.start.step, enabled=self.is_main, unit=self.unit, shown=self.shown)
        step, tokens = self.start.step, self.start.tokens
        stopped: signal.Signals | None = None
        data_seconds = 0.0
        start = time.perf_counter()
        try:
            with StopOnSignal(self.device) as stop:
                while step < total and not stopped:
                    t0 = time.perf_counter()
                    record = self.run_step(step)
                    dt = time.perf_counter() - t0
                    trained = record.pop("_tokens", tokens_per_step)
                    step = self.engine.position(step + 1)  # a replica group that healed: its peers' step
                    tokens = tokens + trained if step == record["step"] else step * tokens_per_step
                    record["step"] = step
                    peak, measures = peak_memory_bytes(self.device)
                    record.update(
                        {f"{self.unit}_per_s": trained / dt},
                        peak_mem_bytes=peak,
                        peak_mem_measures=measures,
                        tokens=tokens,
                    )
                    if self.eval_due(step) and math.isfinite(record["loss"]):  # a diverged step stops below
                        record.update(self.evaluate())
                    record["elapsed_s"] = time.perf_counter() - start
                    data_seconds += record["data_s"]
                    writer.log_step(record)
                    check_finite(record, cfg.train.lr)
                    progress.update(record)
                    checkpointer.poll()
                    stopped = self.engine.stop_here(stop.requested())
                    if stopped or step == total or checkpointer.due(step):
                        checkpointer.save(step, tokens)
            checkpointer.wait()
        finally:
            self.loader.close()
            progress.close()
            writer.close()
        if stopped and self.is_main:
            where = checkpointer.last_published
            log.warning(
                "%s: stopped after step %d of %d with a checkpoint (%s); start again to resume",
                "Ctrl-C" if stopped == signal.SIGINT else stopped.name,
                step,
                total,
                where,
            )
        seconds = time.perf_counter() - start
        peak, kind = peak_memory_bytes(self.device)
        peaks = [0] * dist.get_world_size()
        dist.all_gather_object(peaks, peak)
        done = step - self.start.step
        return TrainResult(
            done,
            step,
            tokens - self.start.tokens,
            seconds,
            peaks,
            kind,
            stopped,
            checkpointer.last_published,
            data_seconds,
            progress.latest,
        )
