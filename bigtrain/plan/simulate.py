"""Verify a plan's peak memory by running bigtrain's own training step for rank 0 of an N-rank job, on fake tensors.

A fake process group (collectives that move nothing) stands in for the other N-1 ranks, ``FakeTensorMode`` makes
every tensor shape-only (no memory, no arithmetic), and torch's memory tracker (``FSDPMemTracker`` for FSDP2,
``MemTracker`` otherwise) records the peak of tensor storage on the device: what ``torch.cuda.max_memory_allocated``
would report, without allocator rounding, CUDA context or NCCL buffers (the planner's margin covers those).

The model is built and sharded by the trainer's code (``shard_model``) and stepped by the trainer's code
(``Trainer.forward_backward``, ``clip_global_grad_norm``, its AdamW). Details that matter:
- One untracked warm-up step runs first: DTensor's sharding propagation fills a cache on first use with tensors of
  global shape under the ambient fake mode, which the tracker would otherwise count as this rank's memory.
- The device mesh is built before entering FakeTensorMode.
- DDP cannot run under FakeTensorMode (its reducer reads tensor data). The plain model is simulated with what
  DDP's reducer adds under ``gradient_as_bucket_view``: one flat fp32 bucket storage, allocated up front and kept,
  into which every gradient is moved once accumulated (``_emulate_ddp_buckets``).
- Two micro-steps are simulated when the plan accumulates, so the unsharded gradients kept between micro-steps
  (sync only on the last) are in the peak; more micro-steps repeat the same pattern.
- transformers cannot read fake position ids, so ``find_packed_sequence_indices`` cannot see that a batch is not
  packed; it then builds a dense L x L causal mask that SDPA keeps, where a real run uses SDPA's ``is_causal`` and no
  mask (measured: +64 MiB at 2048 tokens for a 4-layer model, absent with real tensors). bigtrain never passes
  packed position ids, so during simulation that function is given the answer it returns in real runs: None.
Runs on the CPU device (this torch may have no CUDA); byte counts are the same for the same dtypes and kernels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
import torch.distributed as dist

from bigtrain.config.schema import RecipeConfig
from bigtrain.data.sources import TokenRows
from bigtrain.errors import ConfigError
from bigtrain.plan.plan import Plan


def simulate(
    model_config: dict[str, Any],
    plan: Plan,
    seq_len: int,
    mixed_precision: str,
    global_batch_size: int,
    attn_implementation: str = "sdpa",
) -> dict[str, int]:
    """The tracker's peak snapshot of rank 0: bytes per category (parameters, gradients, ...) and "Total"."""
    if (
        plan.backend not in ("ddp", "fsdp2")
        or plan.tp > 1
        or plan.pp > 1
        or plan.activation_checkpointing == "selective"
    ):
        raise ConfigError(
            "--simulate runs bigtrain's own training step, which runs ddp and fsdp2 without tp, pp or selective "
            "checkpointing so far; pin such a plan, e.g. --fix backend=fsdp2 --fix tp=1 --fix pp=1"
        )
    if dist.is_initialized():
        raise ConfigError("simulation needs its own (fake) process group; run it outside a training job")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore  # importing it registers the "fake" backend
    from transformers import AutoConfig

    from bigtrain.models.build import build_meta_model
    from bigtrain.parallel.apply import ParallelModel, shard_model
    from bigtrain.parallel.runtime import build_topology
    from bigtrain.train.optim import clip_global_grad_norm
    from bigtrain.train.trainer import Trainer

    config = dict(model_config)
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    device = torch.device("cpu")
    cfg = RecipeConfig()
    cfg.train.mixed_precision = mixed_precision
    cfg.train.global_batch_size = global_batch_size
    accum = max(1, global_batch_size // (plan.micro_batch_size * plan.dp))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=plan.world_size)
    try:
        topology = build_topology(plan, device)
        with FakeTensorMode(), _unpacked_batches():
            if plan.backend == "fsdp2":
                model = shard_model(build_meta_model(hf_config, attn_implementation), plan, topology, mixed_precision)
                model.to_empty(device=device)
            else:  # built directly on fake tensors: Module.to_empty cannot swap fake parameters of a plain module
                hf_config.use_cache = False
                from transformers import AutoModelForCausalLM

                model = AutoModelForCausalLM.from_config(
                    hf_config, dtype=torch.float32, attn_implementation=attn_implementation
                )
                shard_model(model, plan, topology, mixed_precision)
            model.train()
            buckets = _emulate_ddp_buckets(model) if plan.backend == "ddp" else None
            rows = TokenRows(np.zeros((1, seq_len), dtype=np.int64), None, "simulated")
            trainer = Trainer(cfg, ParallelModel(model, plan), rows, topology, device, hf_config.vocab_size)
            batches = [
                torch.randint(0, hf_config.vocab_size, (plan.micro_batch_size, seq_len), device=device)
                for _ in range(min(accum, 2))
            ]
            global_tokens = float(global_batch_size * (seq_len - 1))

            factor = trainer.loss_factor(global_tokens, loss_scale=1.0)

            def step(tracker: Any = None) -> None:
                for i, batch in enumerate(batches):
                    if tracker is not None and i > 0:
                        tracker.reset_mod_stats()  # per-module stats only; the device peak is kept
                    trainer.micro_step(batch, i == len(batches) - 1, factor)
                clip_global_grad_norm(trainer.params, cfg.train.grad_clip)
                trainer.optimizer.step()
                trainer.optimizer.zero_grad(set_to_none=True)

            step()  # warm-up, untracked (see the module docstring)
            if plan.backend == "fsdp2":
                tracker = FSDPMemTracker(model, trainer.optimizer)
                tracker.track_inputs(tuple(batches))
            else:
                tracker = MemTracker()
                tracker.track_external(model, trainer.optimizer, buckets, *batches)
            with tracker:
                step(tracker)
            snapshot = tracker.get_tracker_snapshot("peak")[device]
            return {str(getattr(k, "value", k)): int(v) for k, v in snapshot.items()}
    finally:
        dist.destroy_process_group()


def _emulate_ddp_buckets(model: torch.nn.Module) -> torch.Tensor:
    """DDP with gradient_as_bucket_view: gradients are views of one persistent flat fp32 storage."""
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.empty(sum(p.numel() for p in params), dtype=torch.float32, device=params[0].device)
    offset = 0
    for p in params:
        view = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()

        def into_bucket(param: torch.Tensor, view: torch.Tensor = view) -> None:
            if param.grad is not view:
                view.copy_(param.grad)
                param.grad = view

        p.register_post_accumulate_grad_hook(into_bucket)
    return flat


@contextlib.contextmanager
def _unpacked_batches() -> Iterator[None]:
    """Tell transformers' mask code what it would compute from real position ids: the batch is not packed."""
    import transformers.masking_utils as masking

    if not hasattr(masking, "find_packed_sequence_indices"):
        yield
        return
    with mock.patch.object(masking, "find_packed_sequence_indices", lambda position_ids: None):
        yield
