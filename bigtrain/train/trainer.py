"""The training loop. It knows nothing of which backend shards the model.

One optimizer step = ``accum`` micro-steps on this rank's slice of the global batch:
forward -> sum of token losses / tokens of the *whole global batch* -> backward (gradients reduced across ranks only
on the last micro-step) -> global gradient norm and clipping -> AdamW step -> schedule -> log.

Why normalise by the global token count: the mean over micro-batches of per-micro-batch means weights a token by
the size of its micro-batch; dividing every token's loss by the same global count makes the gradient exactly that of
one forward over the whole global batch, for any split into ranks and micro-steps.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from bigtrain.config.schema import RecipeConfig
from bigtrain.data.order import GlobalOrder
from bigtrain.data.sources import TokenRows
from bigtrain.errors import ConfigError
from bigtrain.parallel.apply import ParallelModel
from bigtrain.parallel.fsdp import COMPUTE_DTYPES
from bigtrain.parallel.runtime import Topology
from bigtrain.train.metrics import MetricsWriter, Progress, peak_memory_bytes
from bigtrain.train.optim import (
    DynamicLossScaler,
    build_optimizer,
    build_scheduler,
    clip_global_grad_norm,
    unscale_grads,
)

log = logging.getLogger("bigtrain")
IGNORE_INDEX = -100


def next_token_labels(input_ids: torch.Tensor) -> torch.Tensor:
    """The target of each position: the next token; the last position of each row predicts nothing (ignored).

    The labels are shifted rather than the logits sliced: slicing would copy the largest tensor of the step
    whenever the micro-batch holds more than one row.
    """
    return F.pad(input_ids[:, 1:], (0, 1), value=IGNORE_INDEX)


def token_loss_sum(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of next-token cross-entropy over the batch, in fp32."""
    labels = next_token_labels(input_ids).flatten()
    return F.cross_entropy(logits.flatten(0, 1).float(), labels, reduction="sum", ignore_index=IGNORE_INDEX)


def predicted_tokens(input_ids: torch.Tensor) -> int:
    """How many next-token targets a batch has."""
    return int((next_token_labels(input_ids) != IGNORE_INDEX).sum())


@dataclass
class TrainResult:
    steps: int
    tokens: int
    seconds: float
    peak_mem_bytes: list[int]  # one per rank
    peak_mem_kind: str


class Trainer:
    def __init__(
        self,
        cfg: RecipeConfig,
        model: ParallelModel,
        data: TokenRows,
        topology: Topology,
        device: torch.device,
        vocab_size: int,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.plan = model.plan
        self.data = data
        self.topology = topology
        self.device = device
        self.is_main = dist.get_rank() == 0
        self.params = model.parameters()
        self.optimizer = build_optimizer(self.params, cfg.train)
        self.scheduler = build_scheduler(self.optimizer, cfg.train)
        self.order = GlobalOrder(len(data.rows), cfg.train.global_batch_size, cfg.data.shuffle, cfg.train.seed)
        self.scaler = DynamicLossScaler(cfg.train.fp16_initial_scale) if cfg.train.mixed_precision == "fp16" else None
        self.vocab_size = vocab_size

    def _autocast(self) -> contextlib.AbstractContextManager:
        # FSDP2 casts parameters itself (MixedPrecisionPolicy); DDP keeps fp32 weights and computes under autocast.
        dtype = COMPUTE_DTYPES[self.cfg.train.mixed_precision]
        if dtype is None or self.plan.backend != "ddp":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def _micro_batches(self, step: int) -> list[torch.Tensor]:
        idx = self.order.micro_batches(step, self.topology.dp_rank, self.topology.dp_size, self.plan.micro_batch_size)
        out = []
        for rows in idx:
            batch = np.asarray(self.data.rows[rows], dtype=np.int64)
            bad = batch[(batch < 0) | (batch >= self.vocab_size)]
            if bad.size:
                raise ConfigError(
                    f"data.path={self.cfg.data.path!r} has token id {int(bad[0])} outside the model's vocabulary "
                    f"of {self.vocab_size}; use a tokenizer that matches the model or a larger vocab_size"
                )
            out.append(torch.from_numpy(batch).to(self.device))
        return out

    def micro_step(self, batch: torch.Tensor, last: bool, loss_factor: float) -> torch.Tensor:
        """Forward and backward of one micro-batch; gradients are reduced across ranks only when ``last``."""
        with self.model.grad_sync(last):
            with self._autocast():
                logits = self.model.module(input_ids=batch).logits
            loss = token_loss_sum(logits, batch)
            del logits  # the loss keeps what backward needs; the compute-dtype logits can go now
            (loss * loss_factor).backward()
        return loss.detach()

    def loss_factor(self, global_tokens: float, loss_scale: float) -> float:
        """What each micro-batch's summed loss is multiplied by before backward.

        1/global_tokens normalises by the whole global batch; backends average gradients over the dp ranks, and
        multiplying by dp turns that average back into the sum; loss_scale is fp16's dynamic scale.
        """
        return self.topology.dp_size / global_tokens * loss_scale

    def forward_backward(self, batches: list[torch.Tensor], global_tokens: float, loss_scale: float) -> torch.Tensor:
        """Accumulate gradients of this rank's micro-batches; returns this rank's summed token loss (detached)."""
        factor = self.loss_factor(global_tokens, loss_scale)
        loss_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            loss_sum += self.micro_step(batch, i == len(batches) - 1, factor)
        return loss_sum

    def train_step(self, step: int) -> dict:
        batches = self._micro_batches(step)
        # The token count of the whole global batch must be known before the first backward: it scales every loss.
        counts = torch.tensor([float(sum(predicted_tokens(b) for b in batches))], device=self.device)
        dist.all_reduce(counts)
        global_tokens = float(counts.item())
        loss_scale = self.scaler.scale if self.scaler else 1.0
        loss_sum = self.forward_backward(batches, global_tokens, loss_scale)
        dist.all_reduce(loss_sum)
        if self.scaler:
            unscale_grads(self.params, loss_scale)
        grad_norm = float(clip_global_grad_norm(self.params, self.cfg.train.grad_clip))
        lr = self.scheduler.get_last_lr()[0]
        finite = bool(np.isfinite(grad_norm))
        skipped = self.scaler is not None and not finite
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        record = {"step": step + 1, "loss": float(loss_sum.item()) / global_tokens, "grad_norm": grad_norm, "lr": lr}
        if self.scaler:
            record.update(loss_scale=loss_scale, skipped=skipped)
            self.scaler.update(finite)
            if skipped:
                log.warning("step %d: fp16 gradients overflowed (loss scale %g); step skipped", step + 1, loss_scale)
        return record

    def fit(self) -> TrainResult:
        cfg = self.cfg
        writer = MetricsWriter(cfg.output_dir, enabled=self.is_main)
        writer.write_plan(self.plan)
        progress = Progress(cfg.train.steps, 0, enabled=self.is_main)
        tokens_per_step = cfg.train.global_batch_size * self.data.seq_len
        tokens = 0
        start = time.perf_counter()
        try:
            for step in range(cfg.train.steps):
                t0 = time.perf_counter()
                record = self.train_step(step)
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
