"""The pipelined engine: this rank's pipeline stages driven by a ``torch.distributed.pipelining`` schedule.

The schedule owns the micro-batch loop: it splits the step's batch into the plan's micro-batches, runs forwards and
backwards in its order, sends activations and their gradients between stages, and (for FSDP2 stages) reduces the
gradients once after the last micro-batch. The loss keeps bigtrain's normalisation: the last stage's loss function
returns the *sum* of token losses times 1 / (predicted tokens of the whole global batch), and the schedule is told
not to rescale gradients (``scale_grads=False``), so the gradient is that of one forward over the global batch
whatever the schedule or the number of micro-batches. Clipping, the optimizer and the schedule step are the
torch-native engine's, with the gradient norm summed over the stages of the pipeline.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from bigtrain.config.pipeline import TORCH_SCHEDULES, num_stages
from bigtrain.config.schema import TrainConfig
from bigtrain.data.batch import MicroBatch, concat
from bigtrain.engine.grad_norm import clip_global_grad_norm
from bigtrain.engine.torch_native import (
    OptimizerFactory,
    SchedulerFactory,
    TorchNativeEngine,
    loss_scaler_for,
    optimize_parts,
)
from bigtrain.parallel.transforms.base import BuiltModel


class PipelinedEngine(TorchNativeEngine):
    def __init__(self, built: BuiltModel, *args: Any, **kwargs: Any) -> None:
        super().__init__(built, *args, **kwargs)
        self.num_stages = num_stages(built.plan)
        self.pp_group = built.mesh.mesh["pp"].get_group()
        self.has_first = 0 in built.stage_ids
        self.has_last = self.num_stages - 1 in built.stage_ids
        self._schedule: Any = None
        self.pipeline_stages: list[Any] = []  # torch's PipelineStage objects of this rank (their receive buffers)
        self._schedule_shape: tuple[int, ...] | None = None
        self._losses: list[torch.Tensor] = []  # this step's per-micro-batch token-loss sums (last stage only)
        self._factor = 1.0

    @classmethod
    def create_pipelined(
        cls,
        built: BuiltModel,
        train: TrainConfig,
        make_optimizer: OptimizerFactory,
        make_scheduler: SchedulerFactory,
        device: torch.device,
    ) -> PipelinedEngine:
        """The engine for this rank's stages (``built.parts``): an optimizer and schedule per stage."""
        optimizers, schedulers = optimize_parts(built.parts, make_optimizer, make_scheduler)
        return cls(built, optimizers, schedulers, loss_scaler_for(train), device)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = self.objective.loss_sum(logits, labels)
        self._losses.append(loss.detach())
        if not torch.is_grad_enabled():
            # evaluation: the stage keeps each micro-batch's output for a backward that never comes (its
            # fwd_cache); the last stage's outputs are logits, so drop the earlier micro-batches' (the schedule
            # still reads the current one's entry after this loss)
            for stage in self.pipeline_stages:
                if stage.is_last and stage.fwd_cache:
                    latest = max(stage.fwd_cache)
                    for chunk in [c for c in stage.fwd_cache if c != latest]:
                        del stage.fwd_cache[chunk]
        return loss * self._factor

    def _schedule_for(self, micro_batches: list[MicroBatch]) -> Any:
        """The schedule for this step's shape (built once: the stages' shapes are declared, not discovered)."""
        shape = (len(micro_batches), *micro_batches[0].input_ids.shape)
        if self._schedule is not None and shape == self._schedule_shape:
            return self._schedule
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

        n, micro, seq = shape
        config = self.built.parts[0].config
        dtype = self.built.compute_dtype
        stages = []
        for model, index in zip(self.built.parts, self.built.stage_ids, strict=True):
            first, last = index == 0, index == self.num_stages - 1
            # example tensors declare shape, dtype and whether a gradient flows back (activations: yes)
            inputs = (
                torch.empty(micro, seq, dtype=torch.long, device="meta")
                if first
                else torch.empty(micro, seq, config.hidden_size, dtype=dtype, device="meta", requires_grad=True)
            )
            width = config.vocab_size if last else config.hidden_size
            outputs = torch.empty(micro, seq, width, dtype=dtype, device="meta", requires_grad=True)
            stages.append(
                PipelineStage(
                    model,
                    index,
                    self.num_stages,
                    self.device,
                    input_args=inputs,
                    output_args=outputs,
                    group=self.pp_group,
                )
            )
        self.pipeline_stages = stages
        schedule_class = get_schedule_class(TORCH_SCHEDULES[self.built.plan.pp_schedule])
        single = issubclass(schedule_class, PipelineScheduleSingle)
        self._schedule = schedule_class(
            stages[0] if single else stages, n_microbatches=n, loss_fn=self._loss, scale_grads=False
        )
        self._schedule_shape = shape
        return self._schedule

    def _run_schedule(self, micro_batches: list[MicroBatch], factor: float, train: bool) -> torch.Tensor:
        schedule = self._schedule_for(micro_batches)
        self._factor = factor
        self._losses = []
        batch = concat(micro_batches)  # the schedule splits it back along dim 0
        args = (batch.input_ids,) if self.has_first else ()
        kwargs: dict[str, Any] = {"target": batch.labels} if self.has_last else {}
        if batch.position_ids is not None:  # every stage builds its own attention mask from them
            kwargs["position_ids"] = batch.position_ids
        if train:
            # return_outputs=False: otherwise the last stage keeps every micro-batch's logits until the step ends
            # (found by the pipelined simulation: +b·L·V·a bytes per micro-batch on the last stage)
            schedule.step(*args, **kwargs, return_outputs=False)
        else:
            schedule.eval(*args, **kwargs, return_outputs=False)  # forwards only, in the same order and shapes
        loss_sum = torch.stack(self._losses).sum() if self._losses else torch.zeros((), device=self.device)
        dist.all_reduce(loss_sum, group=self.mesh.batch_group)
        dist.all_reduce(loss_sum, group=self.pp_group)  # from the last stage's ranks (zero elsewhere) to all
        return loss_sum

    def forward_backward(self, micro_batches: list[MicroBatch], loss_factor: float) -> torch.Tensor:
        return self._run_schedule(micro_batches, self._gradient_factor(loss_factor), train=True)

    def eval_sums(self, micro_batches: list[MicroBatch]) -> torch.Tensor:
        """The loss alone: the last stage hands the schedule only the loss (causal LMs report nothing else)."""
        with self._evaluating():
            return self._run_schedule(micro_batches, 1.0, train=False).reshape(1)

    def _clip(self, max_norm: float) -> torch.Tensor:
        return clip_global_grad_norm(self.params, max_norm, stages_group=self.pp_group)
