"""The torch-native engine: DDP, FSDP2 and HSDP through plain autograd, a torch optimizer and our micro-batch loop.

Per micro-step: forward (under autocast when the backend keeps fp32 weights), the summed token loss times the loss
factor, backward inside the backend's gradient-sync context (which decides whether this micro-step reduces across
ranks; see parallel/fsdp.py and parallel/ddp.py). Per step: fp16 unscale, global-norm clip, AdamW (skipped on a
global fp16 overflow), schedule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from bigtrain.config.schema import TrainConfig
from bigtrain.engine.base import Engine, StepResult
from bigtrain.engine.grad_norm import clip_global_grad_norm
from bigtrain.engine.loss import token_loss_sum
from bigtrain.engine.loss_scale import DynamicLossScaler
from bigtrain.parallel.apply import ParallelModel

# Optimizer state keyed by parameter name (not by position), so it follows the parameters to another plan.
STATE_DICT_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


class TorchNativeEngine(Engine):
    def __init__(
        self,
        model: ParallelModel,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        loss_scaler: DynamicLossScaler | None,
        device: torch.device,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_scaler = loss_scaler
        self.device = device
        self.params = [p for group in optimizer.param_groups for p in group["params"]]  # what is clipped and stepped

    @classmethod
    def create(
        cls,
        model: ParallelModel,
        train: TrainConfig,
        make_optimizer: OptimizerFactory,
        make_scheduler: SchedulerFactory,
        device: torch.device,
    ) -> TorchNativeEngine:
        """The engine for a parallelised model: optimizer over its trainable parameters, schedule, and fp16 loss
        scaling when ``train.mixed_precision`` asks for it (the trainer and the simulator both build it here)."""
        optimizer = make_optimizer([p for p in model.model.parameters() if p.requires_grad])
        scaler = DynamicLossScaler(train.fp16_initial_scale) if train.mixed_precision == "fp16" else None
        return cls(model, optimizer, make_scheduler(optimizer), scaler, device)

    @property
    def dp_rank(self) -> int:
        return self.model.mesh.dp_rank

    @property
    def dp_size(self) -> int:
        return self.model.mesh.dp_size

    def data_parallel_sum(self, value: int) -> int:
        total = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(total, group=self.model.mesh.dp_group)
        return int(total.item())

    def _autocast(self) -> contextlib.AbstractContextManager:
        dtype = self.model.autocast_dtype
        return contextlib.nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def _micro_step(self, batch: torch.Tensor, last: bool, factor: float) -> torch.Tensor:
        with self.model.grad_sync(last):
            with self._autocast():
                logits = self.model.module(input_ids=batch).logits
            loss = token_loss_sum(logits, batch)
            del logits  # the loss keeps what backward needs; the compute-dtype logits can go now
            (loss * factor).backward()
        return loss.detach()

    def forward_backward(self, micro_batches: list[torch.Tensor], loss_factor: float) -> torch.Tensor:
        # DDP and FSDP2 average gradients over the data-parallel ranks; multiplying by dp turns that average back
        # into the sum that 1/global_tokens normalises. fp16 also scales by its dynamic loss scale.
        factor = loss_factor * self.dp_size * (self.loss_scaler.scale if self.loss_scaler else 1.0)
        loss_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro_batches):
            loss_sum += self._micro_step(batch, i == len(micro_batches) - 1, factor)
        dist.all_reduce(loss_sum, group=self.model.mesh.dp_group)
        return loss_sum

    def step(self, max_norm: float) -> StepResult:
        scale = self.loss_scaler.scale if self.loss_scaler else None
        if self.loss_scaler:
            self.loss_scaler.unscale(self.params)
        grad_norm = clip_global_grad_norm(self.params, max_norm)
        lr = self.scheduler.get_last_lr()[0]
        skipped = False
        if self.loss_scaler:  # the only host sync of a step, and only under fp16
            finite = bool(torch.isfinite(grad_norm))
            skipped = not finite
            self.loss_scaler.update(finite)
        if not skipped:
            self.optimizer.step()
        self.scheduler.step()
        return StepResult(grad_norm=grad_norm, lr=lr, skipped=skipped, loss_scale=scale)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        model, optimizer = get_state_dict(self.model.model, self.optimizer, options=STATE_DICT_OPTIONS)
        return {
            "model": model,
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "loss_scaler": self.loss_scaler.state_dict() if self.loss_scaler else {},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=STATE_DICT_OPTIONS,
        )
        self.scheduler.load_state_dict(state["scheduler"])
        if self.loss_scaler:
            self.loss_scaler.load_state_dict(state["loss_scaler"])
