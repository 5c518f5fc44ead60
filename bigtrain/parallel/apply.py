"""Apply a plan to a meta model, in one fixed order, then materialise it.

Order: decoder blocks found -> activation checkpointing -> FSDP2 sharding (or nothing for DDP) -> materialise on the
device -> DDP wrapper. Sharding happens on ``meta`` so that no rank ever allocates the unsharded model (DDP excepted).
The returned :class:`ParallelModel` hides the backend from the training loop: it only needs ``forward`` and
``grad_sync(enabled)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bigtrain.config.schema import RecipeConfig
from bigtrain.models.build import build_meta_model, decoder_blocks
from bigtrain.models.materialize import materialize
from bigtrain.parallel.activation_checkpoint import apply_activation_checkpoint
from bigtrain.parallel.fsdp import apply_fsdp
from bigtrain.parallel.runtime import Topology
from bigtrain.plan.plan import Plan


@dataclass
class ParallelModel:
    module: nn.Module  # what forward is called on (the FSDP2 root, or the DDP wrapper)
    plan: Plan

    @contextlib.contextmanager
    def grad_sync(self, enabled: bool) -> Iterator[None]:
        """Reduce gradients across data-parallel ranks only on the last micro-step of an accumulation.

        Inner micro-steps just accumulate into local gradients; reducing each of them would move the same bytes
        ``accum_steps`` times for the same final sum.
        """
        if isinstance(self.module, DistributedDataParallel):
            with contextlib.nullcontext() if enabled else self.module.no_sync():
                yield
        else:
            if hasattr(self.module, "set_requires_gradient_sync"):  # FSDP2; a plain module has nothing to sync
                self.module.set_requires_gradient_sync(enabled)
            yield

    def parameters(self) -> list[nn.Parameter]:
        return list(self.module.parameters())


def shard_model(model: nn.Module, plan: Plan, topology: Topology, mixed_precision: str) -> nn.Module:
    """Activation checkpointing, then FSDP2 (for fsdp2 plans), applied in place to an unmaterialised model."""
    blocks = apply_activation_checkpoint(decoder_blocks(model), plan.activation_checkpointing)
    if plan.backend == "fsdp2":
        apply_fsdp(model, blocks, plan, topology.dp_mesh, mixed_precision)
    return model


def build_parallel_model(
    cfg: RecipeConfig, hf_config: Any, plan: Plan, topology: Topology, device: torch.device
) -> ParallelModel:
    model = build_meta_model(hf_config, cfg.model.attn_implementation)
    shard_model(model, plan, topology, cfg.train.mixed_precision)
    meta_twin = build_meta_model(hf_config, cfg.model.attn_implementation)
    materialize(model, meta_twin, device, cfg.model.name_or_path, cfg.train.seed)
    model.train()
    if plan.backend == "ddp":
        device_ids = [device.index] if device.type == "cuda" else None
        # gradient_as_bucket_view: gradients live inside DDP's communication buckets instead of beside them (saves 4Ψ)
        module: nn.Module = DistributedDataParallel(
            model, device_ids=device_ids, process_group=topology.dp_mesh.get_group(), gradient_as_bucket_view=True
        )
    else:
        module = model
    return ParallelModel(module=module, plan=plan)
