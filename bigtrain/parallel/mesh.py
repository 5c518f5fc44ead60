"""The one named device mesh of a job, built from the plan: (pp, dp_replicate, dp_shard, cp, tp), tp innermost.

Rank r sits at coordinates (pp, dp_replicate, dp_shard, cp, tp) in row-major order, so tp groups are runs of
consecutive ranks (the GPUs of one node: tensor parallelism's per-layer all-reduces need the fastest links), cp
groups the next ones (context parallelism's all-to-alls around every attention), and pp is outermost (a pipeline
stage boundary is the cheapest thing to cross between nodes). Every degree and every coordinate the trainer uses is
read from this mesh; nothing assumes that the data-parallel rank is the global rank. Flattened dimensions:
- ``dp`` (dp_replicate x dp_shard): the ranks that read different rows;
- ``dp_cp`` (dp x cp): the ranks that see different tokens: token counts and losses are summed over it, and
  gradients reduced over it (DDP all-reduces over it);
- ``dp_shard_cp`` (dp_shard x cp): what FSDP2 shards parameters over (torchtitan's layout: the cp ranks of a row
  hold the same parameters, so they shard them too).
With semi-synchronous replicas (``parallel.sync``: local SGD, DiLoCo) the dp_replicate groups train apart between
synchronisations: token counts, losses and gradients stay inside a group (dp_shard x cp), FSDP2 shards over the
group alone, and ``replica_group`` joins the groups for the outer all-reduce. The data still splits over all of dp.
With expert parallelism (``plan.ep``) dp_shard is also seen as (efsdp, ep), ep innermost: a mixture's experts are
split over the ep ranks (consecutive ranks: the all-to-alls stay on the fastest links) and each expert is sharded
by FSDP2 over the efsdp = dp_shard / ep ranks that hold the same experts (torchtitan's and transformers' layout).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.plan import Plan

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass(frozen=True)
class WorldMesh:
    mesh: DeviceMesh  # all five dimensions, size 1 where the plan does not use one
    dp_mesh: DeviceMesh  # dp_replicate x dp_shard flattened into one dimension named "dp"
    batch_mesh: DeviceMesh  # dp x cp flattened ("dp_cp"): every rank that sees different tokens
    shard_mesh: DeviceMesh  # dp_shard x cp flattened ("dp_shard_cp")
    ep_mesh: DeviceMesh | None = None  # expert parallelism: the ranks a block's experts are split over
    expert_fsdp_mesh: DeviceMesh | None = None  # what FSDP2 shards each expert over (efsdp; HSDP: dp_replicate x it)
    replicas_apart: bool = False  # the dp_replicate groups synchronise every H steps, not every step (parallel.sync)

    def degree(self, dim: str) -> int:
        return self.mesh[dim].size()

    def coordinate(self, dim: str) -> int:
        """This rank's index along ``dim`` (0-based)."""
        return self.mesh[dim].get_local_rank()

    @property
    def dp_rank(self) -> int:
        """Which slice of each global batch this rank reads."""
        return self.dp_mesh.get_local_rank()

    @property
    def dp_size(self) -> int:
        return self.dp_mesh.size()

    @property
    def batch_group(self) -> dist.ProcessGroup:
        """The ranks over which token counts and losses are summed and gradients reduced (dp x cp; a replica group's
        dp_shard x cp when the replicas train apart)."""
        return self._step_mesh.get_group()

    @property
    def batch_size(self) -> int:
        return self._step_mesh.size()

    @property
    def _step_mesh(self) -> DeviceMesh:
        return self.shard_mesh if self.replicas_apart else self.batch_mesh

    @property
    def replica_group(self) -> dist.ProcessGroup:
        """This rank's peers at the same place of the other replica groups (the outer all-reduce)."""
        return self.mesh["dp_replicate"].get_group()

    @property
    def cp_group(self) -> dist.ProcessGroup:
        return self.mesh["cp"].get_group()

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """What FSDP2 shards over: dp_shard (x cp), or (dp_replicate, dp_shard x cp) for HSDP (all-reduce across
        replicas)."""
        shard = self.shard_mesh if self.degree("cp") > 1 else self.mesh["dp_shard"]
        if self.degree("dp_replicate") > 1 and not self.replicas_apart:
            if self.degree("cp") > 1:
                return self.mesh["dp_replicate", "dp_shard_cp"]
            return self.mesh["dp_replicate", "dp_shard"]
        return shard


def build_world_mesh(plan: Plan, device_type: str) -> WorldMesh:
    """The job's mesh; the process group must exist and its size must be the plan's world size."""
    world = dist.get_world_size()
    if world != plan.world_size:  # resolve_plan checked this against WORLD_SIZE; a mismatch is a launcher problem
        raise RuntimeError(f"the plan needs {plan.world_size} ranks but the process group has {world}")
    shape = tuple(getattr(plan, dim) for dim in MESH_DIMS)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)
    # torch keeps no public flatten yet; torchtitan uses the same calls for its "dp" and "dp_shard_cp" dimensions
    dp = mesh["dp_replicate", "dp_shard"]._flatten("dp")
    batch = mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
    shard = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    apart = settings_of(plan).semi_synchronous
    if plan.ep == 1:
        return WorldMesh(mesh, dp, batch, shard, replicas_apart=apart)
    experts = mesh._unflatten("dp_shard", (plan.dp_shard // plan.ep, plan.ep), ("efsdp", "ep"))
    efsdp = experts["dp_replicate", "efsdp"] if plan.dp_replicate > 1 and not apart else experts["efsdp"]
    return WorldMesh(mesh, dp, batch, shard, ep_mesh=experts["ep"], expert_fsdp_mesh=efsdp, replicas_apart=apart)
