"""The one named device mesh of a job, built from the plan: (pp, dp_replicate, dp_shard, tp), tp innermost.

Rank r sits at coordinates (pp, dp_replicate, dp_shard, tp) in row-major order, so tp groups are runs of
consecutive ranks (the GPUs of one node: tensor parallelism's per-layer all-reduces need the fastest links) and pp
is outermost (a pipeline stage boundary is the cheapest thing to cross between nodes). Every degree and every
coordinate the trainer uses is read from this mesh; nothing assumes that the data-parallel rank is the global rank.
The two data-parallel dimensions are also flattened into one named ``dp`` dimension: the group over which ranks see
different samples, and over which DDP all-reduces and token counts are summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from bigtrain.config.plan import Plan

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class WorldMesh:
    mesh: DeviceMesh  # all four dimensions, size 1 where the plan does not use one
    dp_mesh: DeviceMesh  # dp_replicate x dp_shard flattened into one dimension named "dp"

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
    def dp_group(self) -> dist.ProcessGroup:
        return self.dp_mesh.get_group()

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """What FSDP2 shards over: dp_shard, or (dp_replicate, dp_shard) for HSDP (all-reduce across replicas)."""
        if self.degree("dp_replicate") > 1:
            return self.mesh["dp_replicate", "dp_shard"]
        return self.mesh["dp_shard"]


def build_world_mesh(plan: Plan, device_type: str) -> WorldMesh:
    """The job's mesh; the process group must exist and its size must be the plan's world size."""
    world = dist.get_world_size()
    if world != plan.world_size:  # resolve_plan checked this against WORLD_SIZE; a mismatch is a launcher problem
        raise RuntimeError(f"the plan needs {plan.world_size} ranks but the process group has {world}")
    shape = tuple(getattr(plan, dim) for dim in MESH_DIMS)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)
    # torch keeps no public flatten yet; torchtitan uses the same call for its "dp" dimension
    return WorldMesh(mesh, mesh["dp_replicate", "dp_shard"]._flatten("dp"))
