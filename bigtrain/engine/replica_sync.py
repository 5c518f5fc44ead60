"""Semi-synchronous replicas (``parallel.sync``: local SGD, DiLoCo, streaming DiLoCo) around a replica group's engine.

Each dp_replicate group trains its own copy with the torch-native engine built on its own ranks (``WorldMesh``:
``replicas_apart``): its loss is normalised over its own slice of each global batch, its gradients reduced within
it. After inner step s this engine, on each fragment the calendar (``SyncSettings.sends``) names, computes the
pseudo-gradient (the last synchronised weights minus the group's own, in fp32), starts one asynchronous all-reduce
of it over ``replica_group`` in the sync dtype, and ``fragment_delay`` steps later (``applies``) waits for it, takes
the outer step on the synchronised weights and writes them over the group's copy of that fragment. The outer step
is torch's SGD with Nesterov momentum (dampening 0), written out on the fp32 outer state: buf = mu buf + d,
w -= lr (d + mu buf). Every tensor is this rank's local shard: replica groups are built alike, so rank k of every
group holds the same shard of every parameter.

What the run defines as its model is the synchronised weights: they are the checkpoint's ``model`` (what resume
checks and export writes). A fragment still in flight at the last step is applied then, so the final model holds
every group's work up to its last send. Each group's own copy and AdamW state are the checkpoint's
``replicas.r<i>``; a run resumed on another number of groups gives group i the copy of group i mod the old count
(the outer state is the same for all).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from bigtrain.config.capabilities.replica_sync import SyncSettings, settings_of
from bigtrain.data.batch import MicroBatch
from bigtrain.engine.base import REPLICA_STATE, Engine, StepResult
from bigtrain.engine.replica_links import MeshLink, TorchftLink
from bigtrain.engine.torch_native import TorchNativeEngine

ReplicaLink = MeshLink | TorchftLink
log = logging.getLogger("bigtrain")
START_WAIT_S = 120  # how long the groups of a fresh run wait for each other before the first step
# a stop signal (SIGTERM, Ctrl-C) waits for the next synchronisation when it is at most this far off at the group's
# pace (torchft groups only, ``stop_here``); the launcher gives the workers SHUTDOWN_S in all
STOP_WAIT_S = 60.0
OUTER = "outer"


@dataclass
class _Trained:
    """One trained parameter: its names (a tied parameter has two), itself, and its fp32 outer state."""

    names: list[str]
    param: nn.Parameter
    weights: torch.Tensor  # the last synchronised value of this rank's shard
    momentum: torch.Tensor

    @property
    def local(self) -> torch.Tensor:
        return _shard(self.param)

    def as_saved(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (shaped like this rank's shard) as the checkpoint sees the parameter: a DTensor laid out like it."""
        p = self.param
        if not isinstance(p, DTensor):
            return t
        return DTensor.from_local(t, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())


class ReplicaSyncEngine(Engine):
    """The loop's engine for a semi-synchronous plan; everything but the outer synchronisation is ``inner``'s."""

    def __init__(
        self, inner: TorchNativeEngine, settings: SyncSettings, total_steps: int, link: ReplicaLink | None = None
    ) -> None:
        self.inner = inner
        self.objective = inner.objective
        self.settings = settings
        self.total_steps = total_steps
        self.link: ReplicaLink = link or MeshLink(inner.mesh)
        self.replicas, self.replica = self.link.replicas, self.link.index
        self.device = inner.device
        state_device = self.device if settings.outer_state == "device" else torch.device("cpu")
        self.trained = _trained_parameters(inner, state_device)
        self.fragments = _split(self.trained, settings.fragments)
        self.steps = 0  # inner steps taken
        self.commits = 0  # synchronisations (and the groups' first quorum) committed: what torchft compares
        self.in_flight: dict[int, tuple[Any, torch.Tensor]] = {}  # fragment -> its all-reduce
        self.pending: dict[int, torch.Tensor] = {}  # fragment -> its averaged pseudo-gradient, awaiting its step
        self._synchronising = self._peer_synchronising = False  # around a quorum (``_healthy_state``, ``_heal``)
        self._stop_asked: signal.Signals | None = None  # the stop signal this group received (torchft groups)
        self._stop_agreed = False  # a synchronisation carried some group's stop: every group stops after it
        self._stop_alone = False  # the next synchronisation is too far for a stop to wait for it
        self._step_s = 0.0  # the group's recent seconds per step (to tell how far the next synchronisation is)
        self._step_started = time.monotonic()
        self.link.start_together([t.local for t in self.trained])
        for t in self.trained:
            t.weights.copy_(t.local)
        self.link.attach(self._healthy_state, self._heal)

    def join(self, step: int) -> int:
        """Before the first step: a group that is behind the others (restarted after a failure) takes a healthy
        group's state, and if that group is synchronising, synchronises with it; the step to go on from."""
        assert step == self.steps, (step, self.steps)
        healed = self._quorum(synchronising=False)
        deadline = time.monotonic() + START_WAIT_S
        # a run that starts, or starts again from group 0's checkpoint (as fewer groups, say): the groups start
        # together, each on its share of the first steps, asking again until all are there. Every group of a quorum
        # decides alike: one that heals from a group still starting (torchft's first sync, or group 0 resumed) asks
        # again with it; one that restarted alone heals from a group that is synchronising, and joins that
        while not (healed and self._peer_synchronising) and self.link.participants() < self.replicas:
            if time.monotonic() > deadline:  # a group that never came: the others start, it joins when it comes
                break
            time.sleep(0.2)
            healed = self._quorum(synchronising=False)
        if healed and self._peer_synchronising:
            self._catch_up()
            self._step_started = time.monotonic()
            return self.steps
        self.link.barrier()  # a group that heals has its state before the others commit (torchft stops serving it)
        if self.link.commit():  # a quorum of groups that start: nothing to synchronise
            self.commits += 1
        self._step_started = time.monotonic()  # the pace is the steps', not the wait for the others
        return self.steps

    def _quorum(self, synchronising: bool) -> bool:
        """The groups of this synchronisation (torchft: a quorum; a group that is behind heals in it)."""
        self._synchronising = synchronising
        try:
            return self.link.quorum(self.commits)
        finally:
            self._synchronising = False

    def _healthy_state(self) -> dict[str, Any]:
        """What a group that is behind receives from this rank (its peer at the same place of the group): the
        synchronised weights and outer momentum of its shard, the step and schedule, and whether this group is in a
        synchronisation (which the other then joins)."""
        return {
            "weights": [t.weights for t in self.trained],
            "momentum": [t.momentum for t in self.trained],
            "steps": self.steps,
            "commits": self.commits,
            "scheduler": self.inner.schedulers[0].state_dict(),
            "synchronising": self._synchronising,
        }

    @torch.no_grad()
    def _heal(self, state: dict[str, Any]) -> None:
        """Take a healthy group's state: its synchronised weights become this group's copy (``_catch_up``), its step
        and schedule this group's; AdamW's moments start over (they are not sent)."""
        for t, weights, momentum in zip(self.trained, state["weights"], state["momentum"], strict=True):
            t.weights.copy_(weights)
            t.momentum.copy_(momentum)
            t.local.copy_(t.weights)
        self.steps, self.commits = int(state["steps"]), int(state["commits"])
        log.info("replica group %d took a healthy group's state: step %d", self.replica, self.steps)
        self._peer_synchronising = bool(state["synchronising"])
        for optimizer, scheduler in zip(self.inner.optimizers, self.inner.schedulers, strict=True):
            scheduler.load_state_dict(state["scheduler"])
            optimizer.state.clear()
            for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr(), strict=True):
                group["lr"] = lr
        self.in_flight.clear()
        self.pending.clear()

    def position(self, step: int) -> int:
        return self.steps

    def close(self) -> None:
        self.link.close()

    # the engine protocol: the replica group's own step
    @property
    def dp_rank(self) -> int:
        return self.link.data_slice(self.inner.dp_rank, self.inner.dp_size)[0]

    @property
    def dp_size(self) -> int:
        return self.link.data_slice(self.inner.dp_rank, self.inner.dp_size)[1]

    @property
    def sequence_slice(self) -> tuple[int, int]:
        return self.inner.sequence_slice

    def data_parallel_sum(self, value: int) -> int:
        return self.inner.data_parallel_sum(value)

    def forward_backward(self, micro_batches: list[MicroBatch], loss_factor: float) -> torch.Tensor:
        return self.inner.forward_backward(micro_batches, loss_factor)

    def eval_sums(self, micro_batches: list[MicroBatch]) -> torch.Tensor:
        """Each group evaluates its copy on its share of the held-out rows; the sums are the groups' together (after
        a synchronisation, every group's copy is the synchronised model)."""
        sums = self.inner.eval_sums(micro_batches)
        self.link.sum_over_groups(sums)
        return sums

    def held_out_sum(self, value: int) -> int:
        total = torch.tensor([self.inner.data_parallel_sum(value)], dtype=torch.int64, device=self.device)
        self.link.sum_over_groups(total)
        return int(total.item())

    def zero_grad(self) -> None:
        self.inner.zero_grad()

    def step(self, max_norm: float) -> StepResult:
        result = self.inner.step(max_norm)
        self.steps += 1
        self._synchronise(self.steps)
        now = time.monotonic()
        took, self._step_started = now - self._step_started, now
        self._step_s = took if self._step_s == 0 else 0.8 * self._step_s + 0.2 * took
        return result

    def stop_here(self, requested: Any) -> Any:
        """The groups of an elastic run are jobs of their own (torchft) that receive a stop signal at different
        moments, and cannot agree outside a synchronisation: a group's request rides on its next pseudo-gradient
        (one more element, ``_send``), and every group stops after the synchronisation that carries one, all of them
        with the same weights, which group 0's checkpoint then holds. A group whose next synchronisation is more than
        ``STOP_WAIT_S`` away at its pace stops at once, alone, as a group that dies would (its ranks decide that
        together). Other runs stop as signalled: one job of all groups together, a torchft group alone."""
        if not self.link.joint_stop:
            return requested
        if self._stop_agreed:
            return self._stop_asked or signal.SIGTERM
        if requested is not None and self._stop_asked is None:
            self._stop_asked = requested
            steps = self._steps_to_stop_point()
            far = torch.tensor([float(steps * self._step_s > STOP_WAIT_S)], device=self.device)
            dist.all_reduce(far, op=dist.ReduceOp.MAX)  # the group's ranks: each timed its own steps
            self._stop_alone = bool(far.item())
            if dist.get_rank() == 0:
                when = "now, alone" if self._stop_alone else f"after the next synchronisation, in {steps} step(s)"
                log.warning("replica group %d: %s: stopping %s", self.replica, requested.name, when)
        return self._stop_asked if self._stop_alone else None

    def _steps_to_stop_point(self) -> int:
        """Inner steps until a stop asked now takes effect: the next send's synchronisation applied."""
        span = self.settings.every + self.settings.delay
        send = next((s for s in range(self.steps + 1, self.steps + span + 1) if self.settings.sends(s)), None)
        applied = self.total_steps if send is None else min(send + self.settings.delay, self.total_steps)
        return applied - self.steps

    # the outer synchronisation
    def _synchronise(self, step: int) -> None:
        for fragment in self.settings.sends(step):
            if self._quorum(synchronising=True):  # this group was behind: it holds a healthy group's state now
                self._catch_up()
                return
            self._send(fragment)
        self._apply_due(step)

    def _catch_up(self) -> None:
        """After healing (its copy is the synchronised weights): the synchronisation the healthy groups are doing at
        their step, with a zero pseudo-gradient."""
        for fragment in self.settings.sends(self.steps):
            self._send(fragment)
        self._apply_due(self.steps)

    def _apply_due(self, step: int) -> None:
        waiting = set(self.in_flight) | set(self.pending)
        due = waiting if step == self.total_steps else waiting & set(self.settings.applies(step))
        for fragment in sorted(due):
            self._apply(fragment)

    @torch.no_grad()
    def _send(self, fragment: int) -> None:
        """Start averaging the fragment's pseudo-gradient (synchronised weights minus this group's) over the groups."""
        dtype = torch.bfloat16 if self.settings.dtype == "bf16" else torch.float32
        parts = [(t.weights.to(self.device) - t.local.float()).reshape(-1) for t in self.fragments[fragment]]
        if self.link.joint_stop:  # the group's stop request (stop_here)
            parts.append(torch.full((1,), float(self._stop_asked is not None), device=self.device))
        flat = torch.cat(parts).to(dtype) if parts else torch.zeros(0, dtype=dtype, device=self.device)
        self.in_flight[fragment] = (self.link.all_reduce(flat), flat)

    def _wait(self, fragment: int) -> torch.Tensor:
        """The fragment's averaged pseudo-gradient in fp32 (flat), once its all-reduce is done."""
        if fragment in self.pending:
            return self.pending.pop(fragment)
        work, flat = self.in_flight.pop(fragment)
        return self.link.average(work, flat)

    @torch.no_grad()
    def _apply(self, fragment: int) -> None:
        """The outer step on the fragment's synchronised weights, which then replace the group's copy."""
        average = self._wait(fragment)
        if not self.link.commit():  # a group failed during it: the fragment goes back to the synchronised weights
            for t in self.fragments[fragment]:
                t.local.copy_(t.weights)
            return
        self.commits += 1
        shards = sum(t.weights.numel() for t in self.fragments[fragment])
        if average.numel() > shards and average[shards].item() > 0:  # some group asked to stop (stop_here)
            self._stop_agreed = True
        lr, mu = self.settings.outer_lr, self.settings.outer_momentum
        for t, delta in self._pieces(fragment, average):
            delta = delta.to(t.weights.device)
            t.momentum.mul_(mu).add_(delta)
            t.weights.sub_(delta.add(t.momentum, alpha=mu), alpha=lr)
            t.local.copy_(t.weights)

    # checkpoints
    def state_dict(self) -> dict[str, Any]:
        inner = self.inner.state_dict()
        own = {"model": inner.pop("model"), "optimizer": inner.pop("optimizer")}
        outer: dict[str, Any] = {"steps": self.steps, "commits": self.commits}
        outer["momentum"] = self._named(lambda t: t.momentum)
        pending = self._pending_now()
        if pending:
            outer["pending"] = pending
        return {
            "model": self._named(lambda t: t.weights),
            OUTER: outer,
            REPLICA_STATE: {f"r{self.replica}": own},
            **inner,  # the schedule and the loss scaler: the same in every group
        }

    def _named(self, tensor_of: Any) -> dict[str, torch.Tensor]:
        return {name: t.as_saved(tensor_of(t)) for t in self.trained for name in t.names}

    def _pending_now(self) -> dict[str, torch.Tensor]:
        """The averaged pseudo-gradients of the fragments in flight (sent, not yet applied), waited for and kept."""
        out: dict[str, torch.Tensor] = {}
        for fragment in sorted(set(self.in_flight) | set(self.pending)):
            average = self._wait(fragment)
            self.pending[fragment] = average
            for t, view in self._pieces(fragment, average):
                out.update({name: t.as_saved(view) for name in t.names})
        return out

    def _pieces(self, fragment: int, flat: torch.Tensor) -> Iterator[tuple[_Trained, torch.Tensor]]:
        """Each parameter of the fragment with its part of ``flat`` (the fragment's shards end to end, as sent)."""
        offset = 0
        for t in self.fragments[fragment]:
            n = t.weights.numel()
            yield t, flat[offset : offset + n].view_as(t.weights)
            offset += n

    def state_to_load(self, saved: Collection[str]) -> dict[str, Any]:
        """What to read of a checkpoint holding ``saved`` keys: this group's copy is group i mod the saved count's,
        and the averages of the fragments that were in flight when it was saved."""
        counts = {key.split(".")[1] for key in saved if key.startswith(f"{REPLICA_STATE}.")}
        if not counts:  # written by every-step training: its model and optimizer are every group's start
            return self.inner.state_dict()
        source = f"r{self.replica % len(counts)}"
        state = self.state_dict()
        state[REPLICA_STATE] = {source: state[REPLICA_STATE].pop(f"r{self.replica}")}
        pending = {
            name: t.as_saved(torch.zeros_like(t.weights))
            for t in self.trained
            for name in t.names
            if f"{OUTER}.pending.{t.names[0]}" in saved
        }
        if pending:
            state[OUTER]["pending"] = pending
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.in_flight.clear()
        self.pending.clear()
        if REPLICA_STATE not in state:  # an every-step checkpoint: the synchronised weights are its model
            self.inner.load_state_dict(state)
            self.steps = self.commits = int(self.inner.schedulers[0].last_epoch)
            for t in self.trained:
                t.weights.copy_(t.local)
                t.momentum.zero_()
            return
        (own,) = state[REPLICA_STATE].values()
        self.inner.load_state_dict({**state, **own})
        self.steps, self.commits = int(state[OUTER]["steps"]), int(state[OUTER]["commits"])
        # the outer tensors were read in place; a fragment in flight when it was saved resumes with its average
        pending = state[OUTER].get("pending", {})
        for fragment, members in enumerate(self.fragments):
            if members and members[0].names[0] in pending:
                self.pending[fragment] = torch.cat(
                    [_shard(pending[t.names[0]]).reshape(-1).float().to(self.device) for t in members]
                )


def _shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a parameter or saved tensor (a DTensor's local tensor), without autograd."""
    return t.to_local() if isinstance(t, DTensor) else t.data


def _trained_parameters(engine: TorchNativeEngine, state_device: torch.device) -> list[_Trained]:
    """The parameters the optimizer steps, under their HF names, each with fp32 outer state of its local shard."""
    by_id: dict[int, _Trained] = {}
    for part in engine.parts:
        for name, p in part.named_parameters(remove_duplicate=False):
            if not p.requires_grad:
                continue
            if id(p) not in by_id:
                local = _shard(p)
                pin = state_device.type == "cpu" and local.device.type == "cuda"
                weights = torch.empty(local.shape, dtype=torch.float32, device=state_device, pin_memory=pin)
                by_id[id(p)] = _Trained([], p, weights, torch.zeros_like(weights))
            by_id[id(p)].names.append(engine.built.hf_name(name))
    return list(by_id.values())


def _split(trained: list[_Trained], fragments: int) -> list[list[_Trained]]:
    """Consecutive parameters (the model's order: embeddings, blocks, head) cut into ``fragments`` of about equal size,
    by the parameters' global sizes so that every rank cuts alike."""
    total = sum(t.param.numel() for t in trained)
    out: list[list[_Trained]] = [[] for _ in range(fragments)]
    seen = 0
    for t in trained:
        index = min(fragments - 1, seen * fragments // max(total, 1))
        out[index].append(t)
        seen += t.param.numel()
    return out


def wrap(engine: Engine, options: Any, train: Any) -> Engine:
    """The replica-sync record's engine (``Capability.engine``): ``engine`` inside one when the plan's replica groups
    synchronise every H steps; as it is otherwise, and in the simulator, which measures one group's step."""
    sync = settings_of(options.plan)
    if not sync.semi_synchronous or options.values == "empty":
        return engine
    assert isinstance(engine, TorchNativeEngine), "the table runs semi-synchronous plans on this engine only"
    return ReplicaSyncEngine(engine, sync, train.steps, options.replicas)
