"""FSDP2 (``fully_shard``): each decoder block is one sharding unit, the root holds embeddings, final norm and head.

``zero_stage`` 3 frees each block's gathered parameters after its forward (ZeRO-3: least memory, one more all-gather
in backward); 2 keeps them until backward is done (ZeRO-2-like: gradients and optimizer states sharded, no
re-gather). Mixed precision keeps fp32 sharded master weights, computes in bf16/fp16 and reduces gradients in fp32.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from bigtrain.plan.plan import Plan

log = logging.getLogger("bigtrain")

COMPUTE_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def apply_fsdp(model: nn.Module, blocks: list[nn.Module], plan: Plan, mesh: DeviceMesh, mixed_precision: str) -> None:
    mp = MixedPrecisionPolicy(param_dtype=COMPUTE_DTYPES[mixed_precision], reduce_dtype=torch.float32)
    offload: OffloadPolicy = OffloadPolicy()
    if plan.offload_params:
        if mesh.device_type == "cuda":
            offload = CPUOffloadPolicy()
        else:
            log.warning("parallel.offload_params has no effect on CPU: parameters already live in host memory")
    # 2-D mesh (dp_replicate, dp_shard) gives HSDP: shard within a group, all-reduce across replicas.
    shard_mesh = mesh if plan.dp_replicate > 1 else mesh["dp_shard"]
    reshard = plan.zero_stage == 3
    for block in blocks:
        fully_shard(block, mesh=shard_mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=reshard)
    # The root's parameters (embeddings, head) are needed again at once by backward: never reshard them after forward.
    fully_shard(model, mesh=shard_mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=False)
