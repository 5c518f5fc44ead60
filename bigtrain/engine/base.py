"""The engine protocol: everything the training loop may ask of a parallel backend, and nothing more.

One optimizer step is ``train_step``: forward and backward over this rank's micro-batches with every token loss
multiplied by ``1 / global_tokens`` (the predicted tokens of the whole global batch), one clip by the true global
gradient norm, the optimizer and schedule step, zero-grad. How that happens is the engine's business: the
torch-native engine (DDP, FSDP2, HSDP) runs the micro-batch loop itself and syncs gradients per the plan; a
pipelined engine hands the micro-batches to a schedule; a DeepSpeed engine owns backward, accumulation, clipping and
loss scaling. The loop and the simulator call ``train_step``; neither names a backend.

Values come back as tensors where computing them needs no host sync (the loss sum, the gradient norm): the simulator
runs this same step on fake tensors, which have no values to read.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from bigtrain.data.batch import MicroBatch
from bigtrain.losses import Objective, Terms

# where a checkpoint of replica groups that train apart keeps each group's own model and optimizer state
# (``replica_sync.py``): ``replicas.r<i>.model`` / ``.optimizer``; its ``model`` is the synchronised weights
REPLICA_STATE = "replicas"


@dataclass(frozen=True)
class StepResult:
    grad_norm: torch.Tensor  # global L2 norm of the gradients before clipping (0-dim)
    lr: float  # the learning rate this step applied
    skipped: bool  # fp16 overflow: the update was skipped (always False without loss scaling)
    loss_scale: float | None  # the fp16 loss scale this step used; None without loss scaling


@contextlib.contextmanager
def evaluating(modules: list[torch.nn.Module]) -> Iterator[None]:
    """Eval mode (no dropout) and no autograd graph, then each module back to the mode it was in."""
    modes = [m.training for m in modules]
    for m in modules:
        m.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, mode in zip(modules, modes, strict=True):
            m.train(mode)


def step_sums(loss: torch.Tensor, terms: Terms) -> torch.Tensor:
    """One micro-batch's [loss sum, then the objective's metric sums] (fp32), what ``forward_backward`` adds up."""
    parts = [loss.float().reshape(1)]
    if terms.metrics is not None:
        parts.append(terms.metrics.float())
    return torch.cat(parts)


class Reference(ABC):
    """A role that annotates a step's micro-batches before the policy's forwards: the reference log-probabilities of
    a preference objective (``roles/reference.py``), the gradient cache of in-batch negatives
    (``roles/in_batch_negatives.py``)."""

    @abstractmethod
    def attach(self, batch: Any) -> Any:
        """``batch`` with what the role gives it."""

    def attach_step(self, micro_batches: list[Any]) -> list[Any]:
        """The step's micro-batches with what the role gives them (a role that reads them together overrides it)."""
        return [self.attach(batch) for batch in micro_batches]


@contextlib.contextmanager
def replaying(batch: Any) -> Iterator[None]:
    """The random state a role recorded before its own forward of ``batch`` (``cached.rng``), restored for the
    forward with a graph, so that dropout draws the same masks in both (the state outside is kept); nothing where
    none was recorded."""
    rng = getattr(getattr(batch, "cached", None), "rng", None)
    if rng is None:
        yield
        return
    from torch.utils.checkpoint import set_device_states

    cpu, devices, states = rng
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(cpu)
        set_device_states(devices, states)
        yield


class Engine(ABC):
    """A model, its optimizer and schedule, and the parallel machinery that trains them. ``objective``: what it
    minimises (the job's objective makes it for the built model, ``build_engine``); the engine drives it without
    knowing which it is. ``reference``: a role that annotates each micro-batch before the policy's forward (a
    reference model's log-probabilities; None: none)."""

    objective: Objective
    reference: Reference | None = None

    def model_output(self, batch: Any) -> Any:
        """The model's forward over one micro-batch as a training step runs it (precision included): what a
        preference objective's reference and its precomputed pass call. Engines that hand whole micro-batch loops
        to a schedule (pipelines) have none."""
        raise NotImplementedError(f"{type(self).__name__} runs no single forward outside its schedule")

    def generate(self, **kwargs: Any) -> torch.Tensor:
        """transformers' ``generate`` on the model as it trains (its current weights, adapters applied, gathered by
        its own hooks where sharded), in eval mode and the step's precision: online RL's rollouts. Every rank of a
        sharded model calls it together (``synced_gpus``)."""
        raise NotImplementedError(f"{type(self).__name__} does not generate yet")

    def with_reference(self, micro_batches: list[Any]) -> list[Any]:
        """The micro-batches with what the reference gives them (all of a step's first: its forwards need no graph,
        and the policy's forwards then run back to back with their backwards)."""
        if self.reference is None:
            return micro_batches
        return self.reference.attach_step(micro_batches)

    @property
    def batch_group(self) -> Any:
        """The ranks that read different rows of each global batch (what a role that reads the whole global batch
        gathers over)."""
        raise NotImplementedError(f"{type(self).__name__} has no data-parallel group of its own")

    @property
    @abstractmethod
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel ranks (which slice of each global batch it reads)."""

    @property
    @abstractmethod
    def dp_size(self) -> int:
        """How many ranks read different samples."""

    @property
    def sequence_slice(self) -> tuple[int, int]:
        """(which slice, how many) of each row's sequence this rank trains on: context parallelism's, else (0, 1)."""
        return 0, 1

    @abstractmethod
    def data_parallel_sum(self, value: int) -> int:
        """Sum of an integer over the data-parallel ranks (e.g. their predicted-token counts), on every rank."""

    def held_out_sum(self, value: int) -> int:
        """Sum of an integer over every rank that evaluates a share of the held-out rows (``eval_sums``'s ranks):
        the data-parallel ranks, and every replica group where they train apart."""
        return self.data_parallel_sum(value)

    @abstractmethod
    def forward_backward(self, micro_batches: list[MicroBatch], loss_factor: float) -> torch.Tensor:
        """Accumulate the gradient of ``loss_factor`` x the summed token loss over this rank's micro-batches; return
        the summed token loss of the whole global batch (all data-parallel ranks), the same on every rank, then
        the objective's metric sums over it (``Terms.metrics``; 1-D, or a 0-dim loss where there are none)."""

    @abstractmethod
    def eval_sums(self, micro_batches: list[MicroBatch]) -> torch.Tensor:
        """Evaluation of these micro-batches, summed over all data-parallel ranks, the same on every rank: [the
        summed loss, then the objective's ``eval_sums``]. A forward without gradients, in eval mode (no dropout),
        with the training step's precision."""

    @abstractmethod
    def step(self, max_norm: float) -> StepResult:
        """Clip the gradients by their global norm (0: measure only), apply the optimizer and the schedule."""

    @abstractmethod
    def zero_grad(self) -> None:
        """Drop the gradients before the next step's micro-batches."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer (keyed by parameter name), schedule and loss-scaler state, sharded as trained."""

    def join(self, step: int) -> int:
        """Before the first step (``step``: where the run starts): the step to start from. Replica groups that are
        jobs of their own may take a healthy group's state and step here (``replica_sync.py``)."""
        return step

    def position(self, step: int) -> int:
        """The step reached once ``step`` steps are done (a replica group that healed jumps to its peers')."""
        return step

    def stop_here(self, requested: Any) -> Any:
        """Whether the run stops after this step, given the stop signal its ranks agreed on (``requested``, None:
        none): at once for most engines; replica groups that are jobs of their own stop together after a
        synchronisation (``replica_sync.py``)."""
        return requested

    def close(self) -> None:
        """Let go of what outlives the process group (torchft's Manager); nothing for most engines."""
        return None

    def state_to_load(self, saved: Collection[str]) -> dict[str, Any]:
        """The state to read a checkpoint holding the keys ``saved`` into (DCP fills its tensors in place):
        ``state_dict``'s, unless the engine reads other keys than it writes (replica groups, ``replica_sync.py``)."""
        del saved
        return self.state_dict()

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (possibly saved under another plan)."""


def train_step(
    engine: Engine, micro_batches: list[MicroBatch], global_tokens: float, max_norm: float
) -> tuple[torch.Tensor, StepResult]:
    """One optimizer step; returns the global batch's summed token loss and what the step did.

    A global batch without a single label (every row a prompt cut off before its answer) has a zero loss and zero
    gradients; the count is taken as 1 so that is what the step computes instead of a division by zero."""
    loss_sum = engine.forward_backward(micro_batches, 1.0 / max(global_tokens, 1))
    result = engine.step(max_norm)
    engine.zero_grad()
    return loss_sum, result
