"""How semi-synchronous replica groups reach each other (``replica_sync.py``): one process group, or torchft.

- ``MeshLink`` (``parallel.replica_failures: stop``, the default): every group is part of one torch.distributed job
  (one torchrun); the outer all-reduce runs over the mesh's dp_replicate dimension. A dead rank stops the job.
- ``TorchftLink`` (``replica_failures: continue``): each group is a torchrun job of its own, joined to the others by
  torchft's ``Manager`` (its process group is rebuilt from a quorum the Lighthouse forms before each
  synchronisation). A group that dies leaves the others training; restarted, it asks for a quorum, receives a
  healthy group's state (``Manager``'s checkpoint transport) and goes on from that group's step. A synchronisation
  that fails (a group died during it) is not committed: every group's fragment goes back to the last synchronised
  weights.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from bigtrain.parallel.mesh import WorldMesh


class MeshLink:
    """The dp_replicate groups of one job: torch.distributed's collectives over the mesh."""

    joint_stop = False  # one job: a signal reaches every group's ranks, which stop together at the step boundary

    def __init__(self, mesh: WorldMesh) -> None:
        self.group = mesh.replica_group
        self.replicas = dist.get_world_size(self.group)
        self.index = mesh.coordinate("dp_replicate")

    def data_slice(self, rank: int, size: int) -> tuple[int, int]:
        """The slice of each global batch this rank reads: the mesh's dp already spans the groups."""
        return rank, size

    def start_together(self, tensors: list[torch.Tensor]) -> None:
        """Every group starts from group 0's weights (built alike, they are; a broadcast makes it so)."""
        for t in tensors:
            dist.broadcast(t, group=self.group, group_src=0)

    def attach(self, state: Callable[[], dict[str, Any]], heal: Callable[[dict[str, Any]], None]) -> None:
        del state, heal  # the groups live and die together: nothing to heal

    def quorum(self, commits: int) -> bool:
        del commits
        return False

    def participants(self) -> int:
        return self.replicas

    def barrier(self) -> None:
        pass  # one job: its groups start together

    def all_reduce(self, flat: torch.Tensor) -> Any:
        return dist.all_reduce(flat, group=self.group, async_op=True)

    def average(self, work: Any, flat: torch.Tensor) -> torch.Tensor:
        work.wait()
        return flat.float() / self.replicas

    def commit(self) -> bool:
        return True

    def sum_over_groups(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, group=self.group)

    def close(self) -> None:
        pass


class TorchftLink:
    """Replica groups that are separate jobs, joined by torchft (the Lighthouse's address in TORCHFT_LIGHTHOUSE, as
    torchft reads it). ``index``/``replicas``: this group's place among the planned groups (its share of every
    global batch); ``rank``/``world``: this rank's place in its own group."""

    def __init__(
        self, index: int, replicas: int, device: torch.device, timeout_s: float, joint_stop: bool = False
    ) -> None:
        self.index, self.replicas = index, replicas
        # an elastic run's groups stop together on a signal (its launcher asks all of them, to start again as fewer);
        # otherwise a group that receives one stops alone and the others train on
        self.joint_stop = joint_stop
        self.device = device
        self.timeout = timedelta(seconds=timeout_s)
        self.manager: Any = None
        self.healed = False

    def data_slice(self, rank: int, size: int) -> tuple[int, int]:
        """Group i of R reads slices [i S, (i + 1) S) of the R S slices of each batch (its own world has S)."""
        return self.index * size + rank, self.replicas * size

    def start_together(self, tensors: list[torch.Tensor]) -> None:
        del tensors  # built from the same seed or checkpoint; a group that is behind heals at its first quorum

    def attach(self, state: Callable[[], dict[str, Any]], heal: Callable[[dict[str, Any]], None]) -> None:
        """Start this rank's torchft Manager (group rank 0 runs its server, which talks to the Lighthouse), with the
        engine's state for a group that needs healing and the engine's way of taking one."""
        from torchft import Manager, ProcessGroupBabyNCCL, ProcessGroupGloo

        def take(received: dict[str, Any]) -> None:
            heal(received)
            self.healed = True

        cuda = self.device.type == "cuda"
        pg = ProcessGroupBabyNCCL(timeout=self.timeout) if cuda else ProcessGroupGloo(timeout=self.timeout)
        self.manager = Manager(
            pg=pg,
            load_state_dict=take,
            state_dict=state,
            min_replica_size=1,
            use_async_quorum=False,  # a group heals before it computes its pseudo-gradient
            replica_id=f"group{self.index}",  # torchft orders groups by the trailing number
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            timeout=self.timeout,
            quorum_timeout=self.timeout,
            connect_timeout=self.timeout,
        )

    def quorum(self, commits: int) -> bool:
        """Ask the Lighthouse for this synchronisation's groups; True when this group was behind (fewer ``commits``
        than another: it missed synchronisations) and has just taken a healthy group's state."""
        self.healed = False
        self.manager.load_state_dict({"step": commits, "batches_committed": commits})  # what torchft compares
        self.manager.start_quorum()
        return self.healed

    def participants(self) -> int:
        """The groups in the last quorum."""
        return int(self.manager.num_participants())

    def barrier(self) -> None:
        """A collective of the quorum's groups (a zero), done once each has its state: torchft serves a healing group
        the state only until the group it heals from commits."""
        self.manager.allreduce(torch.zeros(1, device=self.device)).wait()

    def all_reduce(self, flat: torch.Tensor) -> Any:
        return self.manager.allreduce(flat)  # averaged over the groups in the quorum

    def average(self, work: Any, flat: torch.Tensor) -> torch.Tensor:
        work.wait()
        return flat.float()

    def commit(self) -> bool:
        """Whether every group of the quorum finished the synchronisation (torchft's two-phase commit)."""
        return bool(self.manager.should_commit())

    def sum_over_groups(self, tensor: torch.Tensor) -> None:
        del tensor  # evaluation stays inside the group: a collective outside a synchronisation has no quorum

    def close(self) -> None:
        if self.manager is not None:
            self.manager.shutdown(wait=False)
            self.manager = None
