"""Verify a plan's peak memory by running bigtrain's own training step for rank 0 of an N-rank job, on fake tensors.

A fake process group (collectives that move nothing) stands in for the other N-1 ranks, ``FakeTensorMode`` makes
every tensor shape-only (no memory, no arithmetic), and torch's memory tracker (``FSDPMemTracker`` for FSDP2,
``MemTracker`` otherwise) records the peak of tensor storage on the device: what ``torch.cuda.max_memory_allocated``
would report, without allocator rounding, CUDA context or NCCL buffers (the planner's margin covers those).

The model is built and parallelised by the trainer's code (``parallelize``) and stepped by the trainer's engine
(``train_step`` of the torch-native engine: micro-steps with the plan's gradient sync, global-norm clipping, AdamW).
Details that matter:
- One untracked warm-up step runs first: DTensor's sharding propagation fills a cache on first use with tensors of
  global shape under the ambient fake mode, which the tracker would otherwise count as this rank's memory.
- The device mesh is built before entering FakeTensorMode.
- DDP cannot run under FakeTensorMode (its reducer reads tensor data). The unwrapped model is simulated with what
  DDP's reducer adds under ``gradient_as_bucket_view``: one flat fp32 bucket storage, allocated up front and kept,
  into which every gradient is moved once accumulated (``_emulate_ddp_buckets``).
- Two micro-steps are simulated when the plan accumulates, so the gradients kept between micro-steps (sharded, or
  unsharded with ``grad_reduce: once_per_step``) are in the peak; more micro-steps repeat the same pattern.
- fp16 is simulated as bf16 (same bytes): its loss-scale skip decision reads gradient values, which fakes lack.
- transformers cannot read fake position ids, so ``find_packed_sequence_indices`` cannot see that a batch is not
  packed; it then builds a dense L x L causal mask that SDPA keeps, where a real run uses SDPA's ``is_causal`` and no
  mask (measured: +64 MiB at 2048 tokens for a 4-layer model, absent with real tensors). bigtrain never passes
  packed position ids, so during simulation that function is given the answer it returns in real runs: None.
- torch's vocabulary-parallel cross-entropy (``parallel.loss_parallel``) is over-counted on fake tensors: 22 to 38
  bytes per local logit in bf16 (the excess does not shrink with tp) where the same step on real tensors holds 16
  (``real_tensors=True``, three models). Such plans are refused on fake tensors; ``real_tensors=True`` runs the step
  on real (uninitialised) CPU tensors instead, which is affordable at test widths only.
- Pipelined plans (pp > 1) run torch's own schedule over the trainer's stages, once for every pp coordinate (each
  holds other layers and keeps other micro-batches in flight), with every micro-batch of the step. Three things
  differ from the other plans: the schedule's start-up vote over the pp ranks (STATIC shapes or not) is answered as
  the real ranks answer it, since the fake group's receives carry no values (``_static_pipeline_metadata``); the
  receive buffers the stages allocate in the warm-up step and keep are handed to the tracker; and the tracker is
  torch's MemTracker without its per-module statistics, which refuse a stage's second forward before its first
  backward.
Runs on the CPU device (this torch may have no CUDA); byte counts are the same for the same dtypes and kernels.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker

from bigtrain.config.hf import hf_config_from_dict
from bigtrain.config.pipeline import check_pipeline_parallel
from bigtrain.config.plan import Plan, unsupported
from bigtrain.config.schema import TrainConfig
from bigtrain.data.batch import MicroBatch
from bigtrain.engine.base import train_step
from bigtrain.engine.pipelined import PipelinedEngine
from bigtrain.engine.torch_native import TorchNativeEngine
from bigtrain.errors import ConfigError
from bigtrain.models.build import build_meta_model
from bigtrain.models.materialize import to_empty_keeping_ties
from bigtrain.parallel.apply import parallelize, parallelize_pipeline
from bigtrain.parallel.mesh import build_world_mesh
from bigtrain.train.optim import build_optimizer, build_scheduler


def simulate(
    model_config: dict[str, Any],
    plan: Plan,
    seq_len: int,
    mixed_precision: str,
    global_batch_size: int,
    attn_implementation: str = "sdpa",
    real_tensors: bool = False,
) -> dict[str, int]:
    """The tracker's peak snapshot of rank 0: bytes per category (parameters, gradients, ...) and "Total".

    With pp > 1 the ranks of different pipeline stages hold different layers and keep different numbers of
    micro-batches in flight: the first rank of every pp coordinate is simulated and the largest peak returned, with
    its ``pp_rank``.
    ``real_tensors``: run on real CPU tensors instead of fake ones (memory and time of a real step: small models).
    """
    reason = unsupported(plan)
    if reason is None and plan.backend == "deepspeed":
        reason = (
            "DeepSpeed's own step does not run on fake tensors (its ZeRO memory terms are checked against its real "
            "step instead: bench/deepspeed_memory.py)"
        )
    if reason is None and plan.loss_parallel and not real_tensors:
        reason = "parallel.loss_parallel=true: fake tensors over-count torch's vocabulary-parallel cross-entropy"
    if reason is not None:
        raise ConfigError(f"--simulate runs bigtrain's own training step, which cannot simulate this plan: {reason}")
    if dist.is_initialized():
        raise ConfigError("simulation needs its own (fake) process group; run it outside a training job")
    hf_config = hf_config_from_dict(model_config)
    if plan.pp > 1:
        check_pipeline_parallel(hf_config, plan, global_batch_size)
    args = (hf_config, plan, seq_len, mixed_precision, global_batch_size, attn_implementation, real_tensors)
    if plan.pp == 1:
        return _simulate_rank(0, *args)
    worst: dict[str, int] = {}
    for pp_rank in range(plan.pp):
        # ranks are laid out (pp, dp_replicate, dp_shard, tp) row-major: this is the first rank of pp coordinate p
        peak = _simulate_rank(pp_rank * (plan.world_size // plan.pp), *args)
        if peak["Total"] > worst.get("Total", -1):
            worst = {**peak, "pp_rank": pp_rank}
    return worst


def _simulate_rank(
    rank: int,
    hf_config: Any,
    plan: Plan,
    seq_len: int,
    mixed_precision: str,
    global_batch_size: int,
    attn_implementation: str,
    real_tensors: bool,
) -> dict[str, int]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore  # importing it registers the "fake" backend

    # fp16 stores and computes what bf16 does; its loss-scale skip decision would need real gradient values
    precision = "bf16" if mixed_precision == "fp16" else mixed_precision
    device = torch.device("cpu")
    train = TrainConfig(global_batch_size=global_batch_size, mixed_precision=precision)
    make_optimizer = lambda params: build_optimizer(params, train)  # noqa: E731
    make_scheduler = lambda optimizer: build_scheduler(optimizer, train)  # noqa: E731
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.world_size)
    try:
        mesh = build_world_mesh(plan, device.type)
        # The plan is applied on meta, outside fake mode: FSDP2 over tensor-parallel weights builds (dp, tp) meshes,
        # whose rank coordinates come from real tensor ops.
        meta = build_meta_model(hf_config, attn_implementation)
        if plan.pp > 1:
            parts = parallelize_pipeline(meta, hf_config, plan, mesh, precision)
            modules = parts.stages
        else:
            parallel = parallelize(meta, hf_config, plan, mesh, precision)
            modules = [parallel.model]
        fake_mode = contextlib.nullcontext() if real_tensors else FakeTensorMode()
        with fake_mode, _unpacked_batches(), _static_pipeline_metadata():
            if not real_tensors:
                fake_mode.allow_non_fake_inputs = True  # the meta tensors are to_empty's inputs
            for module in modules:
                to_empty_keeping_ties(module, device)
                module.train()
            if not real_tensors:
                fake_mode.allow_non_fake_inputs = False
            accum = plan.grad_accum_steps(global_batch_size)
            if plan.pp > 1:
                engine: TorchNativeEngine = PipelinedEngine.create_pipelined(
                    parts, train, make_optimizer, make_scheduler, device
                )
                # the schedule's order (and so how many micro-batches are in flight) needs all of them
                micro_steps = accum
            else:
                buckets = _emulate_ddp_buckets(parallel.model) if plan.backend == "ddp" else None
                calls = _ResetModuleStatsPerCall(parallel.model)
                engine = TorchNativeEngine.create(
                    dataclasses.replace(parallel, module=calls), train, make_optimizer, make_scheduler, device
                )
                micro_steps = min(accum, 2)
            batches = [
                MicroBatch.of_ids(
                    torch.randint(0, hf_config.vocab_size, (plan.micro_batch_size, seq_len), device=device)
                )
                for _ in range(micro_steps)
            ]
            inputs = [t for batch in batches for t in batch.tensors()]
            global_tokens = float(global_batch_size * (seq_len - 1))
            train_step(engine, batches, global_tokens, train.grad_clip)  # warm-up, untracked (see the docstring)
            if plan.pp > 1:
                tracker = _HooklessMemTracker()
                tracker.track_external(*modules, *engine.optimizers, *inputs, *_receive_buffers(engine))
            elif plan.backend == "fsdp2":
                tracker = FSDPMemTracker(parallel.model, engine.optimizers[0])
                tracker.track_inputs(tuple(inputs))
                calls.tracker = tracker
            else:
                tracker = MemTracker()
                tracker.track_external(parallel.model, engine.optimizers[0], buckets, *inputs)
                calls.tracker = tracker
            with tracker:
                train_step(engine, batches, global_tokens, train.grad_clip)
            snapshot = tracker.get_tracker_snapshot("peak")[device]
            return {str(getattr(k, "value", k)): int(v) for k, v in snapshot.items()}
    finally:
        dist.destroy_process_group()


class _HooklessMemTracker(MemTracker):
    """torch's MemTracker without its per-module statistics, which refuse a module's second forward before its first
    backward (a pipeline schedule's warm-up): the device-wide peak it keeps is all that is read."""

    def _pre_fw_hook(self, *args: Any) -> None:
        pass

    def _post_fw_hook(self, *args: Any) -> None:
        pass

    def _pre_bw_hook(self, *args: Any) -> None:
        pass

    def _post_bw_hook(self, *args: Any) -> None:
        pass


def _receive_buffers(engine: TorchNativeEngine) -> list[torch.Tensor]:
    """The buffers torch's pipeline stages allocated at the first step to receive activations and gradients into,
    kept for every later step (allocated during the untracked warm-up, so they are handed to the tracker)."""
    buffers = []
    for stage in getattr(engine, "pipeline_stages", []):
        for infos in [*stage.args_recv_info.values(), *stage.grad_recv_info.values()]:
            buffers += [i.buffer for i in infos if getattr(i, "buffer", None) is not None]
    return buffers


@contextlib.contextmanager
def _static_pipeline_metadata() -> Iterator[None]:
    """Stand in for the schedule's start-up vote, whose answer a fake process group cannot carry.

    At its first step a torch pipeline schedule votes over the pp ranks whether every stage declared its input and
    output shapes (STATIC) or they must be discovered by sending metadata between ranks (DYNAMIC), and reads the
    result with ``.item()``. bigtrain's stages always declare plain-tensor shapes, so every stage votes STATIC and
    the vote's outcome is known; it is set here, after checking each stage's own vote as torch would compute it.
    """
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining._utils import InferenceMode

    def vote(self: Any, stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
        for stage in stages:
            if InferenceMode.needs_dynamic(stage._user_meta, has_backward):
                raise ConfigError(f"pipeline stage {stage.stage_index} needs shape discovery: cannot be simulated")
            stage._inference_mode = InferenceMode.STATIC

    with mock.patch.object(schedules._PipelineSchedule, "_warmup_p2p", vote):
        yield


class _ResetModuleStatsPerCall:
    """Calls the model for the engine; before each call, clears the tracker's per-module statistics.

    torch's memory trackers refuse a second top-level forward of the same module (one per micro-step) unless the
    per-module stats of the previous one are reset; the device-wide peak, which is what is read, is kept.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.tracker: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.tracker is not None:
            self.tracker.reset_mod_stats()
        return self.model(*args, **kwargs)


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
