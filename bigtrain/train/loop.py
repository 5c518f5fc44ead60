"""The training loop. It talks to an engine and nothing else: it never learns how the model is parallelised.

Each optimizer step: this rank's micro-batches from the loader -> the predicted-token count of the whole global
batch (summed over data-parallel ranks before any backward, because it scales every token's loss) -> the engine's
``train_step`` -> log.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.data.loader import StepLoader
from bigtrain.engine.base import Engine, train_step
from bigtrain.train.metrics import MetricsWriter, Progress, peak_memory_bytes

log = logging.getLogger("bigtrain")


@dataclass
class TrainResult:
    steps: int
    tokens: int
    seconds: float
    peak_mem_bytes: list[int]  # one per rank
    peak_mem_kind: str


class TrainLoop:
    def __init__(
        self, cfg: RecipeConfig, plan: Plan, engine: Engine, loader: StepLoader, seq_len: int, device: torch.device
    ) -> None:
        self.cfg = cfg
        self.plan = plan
        self.engine = engine
        self.loader = loader
        self.seq_len = seq_len
        self.device = device
        self.is_main = dist.get_rank() == 0

    def run_step(self, step: int) -> dict:
        """One optimizer step (0-based ``step``); returns its metrics record."""
        batch = self.loader(step)
        global_tokens = self.engine.data_parallel_sum(batch.tokens)
        loss_sum, result = train_step(self.engine, batch.micro_batches, global_tokens, self.cfg.train.grad_clip)
        record = {
            "step": step + 1,
            "loss": float(loss_sum) / global_tokens,
            "grad_norm": float(result.grad_norm),
            "lr": result.lr,
        }
        if result.loss_scale is not None:
            record.update(loss_scale=result.loss_scale, skipped=result.skipped)
            if result.skipped:
                log.warning(
                    "step %d: fp16 gradients overflowed (loss scale %g); step skipped", step + 1, result.loss_scale
                )
        return record

    def run(self) -> TrainResult:
        cfg = self.cfg
        writer = MetricsWriter(cfg.output_dir, enabled=self.is_main)
        writer.write_plan(self.plan)
        progress = Progress(cfg.train.steps, 0, enabled=self.is_main)
        tokens_per_step = cfg.train.global_batch_size * self.seq_len
        tokens = 0
        start = time.perf_counter()
        try:
            for step in range(cfg.train.steps):
                t0 = time.perf_counter()
                record = self.run_step(step)
                dt = time.perf_counter() - t0
                tokens += tokens_per_step
                peak, _ = peak_memory_bytes(self.device)
                record.update(
                    tokens_per_s=tokens_per_step / dt,
                    peak_mem_bytes=peak,
                    tokens=tokens,
                    elapsed_s=time.perf_counter() - start,
                )
                writer.log_step(record)
                progress.update(record["loss"], record["tokens_per_s"])
        finally:
            progress.close()
            writer.close()
        seconds = time.perf_counter() - start
        peak, kind = peak_memory_bytes(self.device)
        peaks = [0] * dist.get_world_size()
        dist.all_gather_object(peaks, peak)
        return TrainResult(cfg.train.steps, tokens, seconds, peaks, kind)
