"""The torch-native engine: DDP, FSDP2 and HSDP through plain autograd, a torch optimizer and our micro-batch loop.

Per micro-step: forward (under autocast when the backend keeps fp32 weights), the summed token loss times the loss
factor, backward inside the backend's gradient-sync context (which decides whether this micro-step reduces across
ranks; see parallel/fsdp.py and parallel/ddp.py). Per step: fp16 unscale, global-norm clip, AdamW (skipped on a
global fp16 overflow), schedule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel

from bigtrain.config.schema import TrainConfig
from bigtrain.data.batch import MicroBatch
from bigtrain.engine.base import Engine, StepResult, evaluating, replaying, step_sums
from bigtrain.engine.grad_norm import clip_global_grad_norm
from bigtrain.engine.loss_scale import DynamicLossScaler
from bigtrain.losses import Terms
from bigtrain.parallel.transforms.base import BuiltModel

# Optimizer state keyed by parameter name (not by position), so it follows the parameters to another plan. Frozen
# parameters (the base under LoRA) are not state: they come from the base model, so a checkpoint holds the adapters;
# the parts model.freeze names are (KEEP_FROZEN_*: state_options).
STATE_DICT_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True, ignore_frozen_params=True)
# Loading: every trained entry is looked up by name below (a missing one is a KeyError); the frozen ones are absent
# on purpose, which torch's strict load would call missing.
LOAD_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True, ignore_frozen_params=True, strict=False)
KEEP_FROZEN_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
KEEP_FROZEN_LOAD_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True, strict=False)

OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


class TorchNativeEngine(Engine):
    """Also the base of the pipelined engine: ``built.parts`` are the HF models this rank trains (one, or its
    pipeline stages), each with its own optimizer and schedule (torch's distributed state dicts pair a module with
    the optimizer of exactly its parameters); one loss scaler and one clip span them all."""

    def __init__(
        self,
        built: BuiltModel,
        optimizers: list[torch.optim.Optimizer],
        schedulers: list[torch.optim.lr_scheduler.LRScheduler],
        loss_scaler: DynamicLossScaler | None,
        device: torch.device,
    ) -> None:
        self.built = built
        self.parts = built.parts
        self.mesh = built.mesh
        self.optimizers = optimizers
        self.schedulers = schedulers
        self.loss_scaler = loss_scaler
        self.device = device
        # what is clipped and stepped
        self.params = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]

    @classmethod
    def create(
        cls,
        built: BuiltModel,
        train: TrainConfig,
        make_optimizer: OptimizerFactory,
        make_scheduler: SchedulerFactory,
        device: torch.device,
    ) -> TorchNativeEngine:
        """The engine for a built model: optimizer over its trainable parameters, schedule, and fp16 loss scaling
        when ``train.mixed_precision`` asks for it."""
        optimizers, schedulers = optimize_parts(built.parts, make_optimizer, make_scheduler)
        return cls(built, optimizers, schedulers, loss_scaler_for(train), device)

    @property
    def dp_rank(self) -> int:
        return self.mesh.dp_rank

    @property
    def dp_size(self) -> int:
        return self.mesh.dp_size

    @property
    def sequence_slice(self) -> tuple[int, int]:
        return self.mesh.coordinate("cp"), self.mesh.degree("cp")

    def data_parallel_sum(self, value: int) -> int:
        # over dp x cp: a context-parallel rank counts the labels of its slice of each row
        total = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(total, group=self.mesh.batch_group)
        return int(total.item())

    def _autocast(self) -> contextlib.AbstractContextManager:
        dtype = self.built.autocast_dtype
        return contextlib.nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def model_output(self, batch: MicroBatch) -> Any:
        """The model's forward over one micro-batch, under autocast where the backend keeps fp32 weights."""
        with self._autocast(), replaying(batch):
            return self.built.forward_module(**batch.model_inputs())

    @property
    def batch_group(self) -> Any:
        return self.mesh.batch_group

    @contextlib.contextmanager
    def generating(self) -> Iterator[torch.nn.Module]:
        """The model generation runs: the HF model itself (not the DDP wrapper: generation syncs no gradients), in
        eval mode without a graph, under the step's autocast; FSDP2's hooks on it gather each unit's parameters for
        every forward of the generation loop."""
        with evaluating(self.parts), self._autocast():
            yield self.built.parts[0]

    def generate(self, **kwargs: Any) -> torch.Tensor:
        with self.generating() as model:
            return model.generate(**kwargs)

    def _forward_loss(self, batch: MicroBatch) -> Terms:
        """The objective's terms of one micro-batch: its summed loss (a DTensor under loss_parallel), the router's
        load-balancing loss where the model computes one, the step metrics' sums. The compute-dtype logits are not
        kept: the loss holds what backward needs."""
        # Vocabulary-sharded logits (parallel.loss_parallel): torch's loss_parallel computes the cross-entropy on the
        # shards, in forward and in backward.
        output = self.model_output(batch)
        with self._loss_context():
            return self.objective(output, batch)

    def _loss_context(self) -> contextlib.AbstractContextManager:
        return loss_parallel() if self.built.plan.loss_parallel else contextlib.nullcontext()

    def _micro_step(self, batch: MicroBatch, last: bool, factor: float, router_factor: float) -> torch.Tensor:
        with self.built.grad_sync(last):
            terms = self._forward_loss(batch)
            loss, router = terms.loss_sum, terms.per_forward
            with self._loss_context():
                objective = loss * factor
                if router is not None and router_factor:
                    objective = objective + router * router_factor
                objective.backward()
        return step_sums(_local(loss.detach()), terms)

    def _gradient_factor(self, loss_factor: float) -> float:
        # DDP and FSDP2 average gradients over the ranks that see different tokens (dp x cp); multiplying by their
        # number turns that average back into the sum that 1/global_tokens normalises. fp16 also scales by its
        # dynamic loss scale.
        return loss_factor * self.mesh.batch_size * (self.loss_scaler.scale if self.loss_scaler else 1.0)

    def forward_backward(self, micro_batches: list[MicroBatch], loss_factor: float) -> torch.Tensor:
        factor = self._gradient_factor(loss_factor)
        # the router loss: its mean over every forward of the global batch (``losses/causal_lm.router_loss``);
        # the ranks' gradient average already divides by the data-parallel ranks
        scale = self.loss_scaler.scale if self.loss_scaler else 1.0
        router_factor = self.objective.per_forward_weight / len(micro_batches) * scale
        micro_batches = self.with_reference(micro_batches)
        sums = torch.zeros(1 + len(self.objective.metric_names), device=self.device)
        for i, batch in enumerate(micro_batches):
            sums += self._micro_step(batch, i == len(micro_batches) - 1, factor, router_factor)
        dist.all_reduce(sums, group=self.mesh.batch_group)
        return sums

    def _evaluating(self) -> contextlib.AbstractContextManager:
        """Eval mode (no dropout) and no autograd graph, then back to training."""
        return evaluating(self.parts)

    def eval_sums(self, micro_batches: list[MicroBatch]) -> torch.Tensor:
        parts = []
        with self._evaluating():  # a role's own pass too (in-batch negatives embed as the evaluation does)
            micro_batches = self.with_reference(micro_batches)
            for batch in micro_batches:
                output = self.model_output(batch)
                with self._loss_context():
                    terms = self.objective(output, batch)
                loss = _local(terms.loss_sum).float().reshape(1)
                parts.append(torch.cat([loss, self.objective.eval_sums(output, batch, terms)]))
        total = torch.stack(parts).sum(0)
        dist.all_reduce(total, group=self.mesh.batch_group)
        return total

    def _clip(self, max_norm: float) -> torch.Tensor:
        return clip_global_grad_norm(self.params, max_norm)

    def step(self, max_norm: float) -> StepResult:
        scale = self.loss_scaler.scale if self.loss_scaler else None
        if self.loss_scaler:
            self.loss_scaler.unscale(self.params)
        grad_norm = self._clip(max_norm)
        lr = self.schedulers[0].get_last_lr()[0]
        skipped = False
        if self.loss_scaler:  # the only host sync of a step, and only under fp16
            finite = bool(torch.isfinite(grad_norm))
            skipped = not finite
            self.loss_scaler.update(finite)
        for optimizer, scheduler in zip(self.optimizers, self.schedulers, strict=True):
            if not skipped:
                optimizer.step()
            scheduler.step()
        if not skipped:
            self.built.after_optimizer_step()
        return StepResult(grad_norm=grad_norm, lr=lr, skipped=skipped, loss_scale=scale)

    def zero_grad(self) -> None:
        # DDP's gradients are views into its communication buckets: zero them in place. Set to None, the next step's
        # first micro-step (under no_sync) would allocate a second full set of gradients beside the buckets (4
        # bytes per parameter, measured on an H200: bench/results/rank0_h200.md).
        keep_buckets = isinstance(self.built.module, DistributedDataParallel)
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=not keep_buckets)

    def state_dict(self) -> dict[str, Any]:
        model: dict[str, Any] = {}
        optim: dict[str, Any] = {}
        options, _ = state_options(self.built)
        for part, optimizer in zip(self.parts, self.optimizers, strict=True):  # the parts' parameter names are disjoint
            part_model, part_optim = get_state_dict(part, optimizer, options=options)
            frozen = frozen_names(part) if options.ignore_frozen_params else set()
            model.update({self.built.hf_name(k): v for k, v in part_model.items() if k not in frozen})
            optim.update({hf_optimizer_key(k, self.built.hf_name): v for k, v in part_optim.items()})
        return {
            "model": model,
            "optimizer": optim,
            "scheduler": self.schedulers[0].state_dict(),  # the same schedule drives every part
            "loss_scaler": self.loss_scaler.state_dict() if self.loss_scaler else {},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each part takes its own keys, found under their HF names (the transforms' renames)."""
        hf_name = self.built.hf_name
        options, load_options = state_options(self.built)
        for part, optimizer, scheduler in zip(self.parts, self.optimizers, self.schedulers, strict=True):
            own_model, own_optim = get_state_dict(part, optimizer, options=options)
            frozen = frozen_names(part) if options.ignore_frozen_params else set()
            model = {k: state["model"][hf_name(k)] for k in own_model if k not in frozen}
            optim = {k: state["optimizer"][hf_optimizer_key(k, hf_name)] for k in own_optim}
            set_state_dict(part, optimizer, model_state_dict=model, optim_state_dict=optim, options=load_options)
            scheduler.load_state_dict(state["scheduler"])
        if self.loss_scaler:
            self.loss_scaler.load_state_dict(state["loss_scaler"])


def state_options(built: BuiltModel) -> tuple[StateDictOptions, StateDictOptions]:
    """How the model's state is read and written: without the frozen parameters when they are an adapter run's base
    (it comes from the base folder again), with them otherwise (``model.freeze``'s parts are model state)."""
    if any(t.name == "adapters" for t in built.applied):
        return STATE_DICT_OPTIONS, LOAD_OPTIONS
    return KEEP_FROZEN_OPTIONS, KEEP_FROZEN_LOAD_OPTIONS


def frozen_names(part: torch.nn.Module) -> set[str]:
    """Names of the frozen parameters, aliases included: torch's ``ignore_frozen_params`` still returns a frozen
    parameter under its second name (the tied LM head of a frozen embedding)."""
    return {name for name, p in part.named_parameters(remove_duplicate=False) if not p.requires_grad}


def hf_optimizer_key(key: str, hf_name: Callable[[str], str]) -> str:
    """A flattened optimizer-state key (``state.<parameter>.exp_avg``, ``param_groups.<parameter>.lr``) with the
    parameter under its HF name."""
    section, rest = key.split(".", 1)
    parameter, leaf = rest.rsplit(".", 1)
    return f"{section}.{hf_name(parameter)}.{leaf}"


def _local(loss: torch.Tensor) -> torch.Tensor:
    """The loss as a plain tensor: under tp it is replicated, so every rank's local value is the whole loss."""
    return loss.to_local() if isinstance(loss, DTensor) else loss


def optimize_parts(
    parts: list[torch.nn.Module], make_optimizer: OptimizerFactory, make_scheduler: SchedulerFactory
) -> tuple[list[torch.optim.Optimizer], list[torch.optim.lr_scheduler.LRScheduler]]:
    """One optimizer over each part's trainable parameters, and its schedule."""
    optimizers = [make_optimizer([p for p in part.parameters() if p.requires_grad]) for part in parts]
    return optimizers, [make_scheduler(optimizer) for optimizer in optimizers]


def loss_scaler_for(train: TrainConfig) -> DynamicLossScaler | None:
    return DynamicLossScaler(train.fp16_initial_scale) if train.mixed_precision == "fp16" else None
