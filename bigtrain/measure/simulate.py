"""Verify a plan's peak memory by running bigtrain's own training step for rank 0 of an N-rank job, on fake tensors.

A fake process group (collectives that move nothing) stands in for the other N-1 ranks, ``FakeTensorMode`` makes
every tensor shape-only (no memory, no arithmetic), and torch's memory tracker (``FSDPMemTracker`` for FSDP2,
``MemTracker`` otherwise) records the peak of tensor storage on the device: what ``torch.cuda.max_memory_allocated``
would report, without allocator rounding, CUDA context or NCCL buffers (the planner's margin covers those).

The model and its engine come from the trainer's own ``build_engine`` (the one build path, ``parallel/build.py``,
with the values left empty on fake tensors), and the trainer's ``train_step`` steps it: micro-steps with the plan's
gradient sync, global-norm clipping, AdamW. What the simulator adds is only the measuring. Details that matter:
- One untracked warm-up step runs first: DTensor's sharding propagation fills a cache on first use with tensors of
  global shape under the ambient fake mode, which the tracker would otherwise count as this rank's memory.
- The device mesh is built, and the plan applied on meta, outside FakeTensorMode (FSDP2 over tensor-parallel
  weights builds (dp, tp) meshes, whose rank coordinates come from real tensor ops); only the allocation and the
  step run under it.
- DDP cannot run under FakeTensorMode (its reducer reads tensor data). The ddp transform then leaves the model
  unwrapped and emulates what DDP's reducer adds under ``gradient_as_bucket_view`` (``parallel/transforms/ddp.py``).
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
- ``train.compile`` is not simulated (the blocks run eagerly): the planner's compiled terms are measured on a GPU.
- A vision-language model's forward reads values of its batch (image-token counts, Qwen-VL's image grids and
  windows): the batch's token ids and grids stay real and what derives from them only is computed for real
  (``tasks/image_chat_inputs.py``); pixel values and everything the weights touch stay fake.
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
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor import DTensor

from bigtrain.config.capabilities import ModelFacts, Setup, check
from bigtrain.config.capabilities.frozen_parts import placement_of
from bigtrain.config.capabilities.reference import reference_mode
from bigtrain.config.hf import model_config_object, resolve_attention
from bigtrain.config.plan import Plan
from bigtrain.config.schema import AdapterConfig, TrainConfig
from bigtrain.config.workload import Workload
from bigtrain.data.encoded_images import frozen_dtype
from bigtrain.engine import build_engine
from bigtrain.engine.base import train_step
from bigtrain.engine.pipelined import PipelinedEngine
from bigtrain.engine.torch_native import TorchNativeEngine
from bigtrain.errors import ConfigError
from bigtrain.job import Job, named_job
from bigtrain.parallel.transforms.base import BuildOptions
from bigtrain.roles.reference import LiveReference
from bigtrain.tasks import resolve
from bigtrain.train.optim import build_optimizer, build_scheduler


def simulate(
    model_config: dict[str, Any],
    plan: Plan,
    workload: Workload,
    attn_implementation: str = "auto",
    real_tensors: bool = False,
) -> dict[str, int]:
    """The tracker's peak snapshot of rank 0: bytes per category (parameters, gradients, ...) and "Total".

    With pp > 1 the ranks of different pipeline stages hold different layers and keep different numbers of
    micro-batches in flight: the first rank of every pp coordinate is simulated and the largest peak returned, with
    its ``pp_rank``.
    ``real_tensors``: run on real CPU tensors instead of fake ones (memory and time of a real step: small models).
    The job (its task and objective, ``workload.job``) decides the micro-batch, the loss and its roles.
    """
    job = named_job(workload.job.task, workload.job.objective)
    hf_config = model_config_object(model_config)
    resolve(hf_config, job.task.name)  # the task's class, as start-up names it
    if workload.method == "lora" and not workload.modules_to_save and job.task.lora_modules is not None:
        # the modules the task trains beside the adapters (a classifier's head), as in a run
        workload = dataclasses.replace(workload, modules_to_save=tuple(job.task.lora_modules(hf_config)))
    attn_implementation = resolve_attention(hf_config, attn_implementation)  # "auto": the family's own default
    # what the trainer would refuse
    extra = job.task.model_facts(hf_config) if job.task.model_facts is not None else {}
    check(Setup(plan, workload.train_config(), ModelFacts.of(hf_config, **extra), workload.data_facts(), job.facts))
    reason = not_simulated(plan, real_tensors, workload.method)
    if reason is not None:
        raise ConfigError(f"--simulate runs bigtrain's own training step, which cannot simulate this plan: {reason}")
    if dist.is_initialized():
        raise ConfigError("simulation needs its own (fake) process group; run it outside a training job")
    if plan.pp == 1:
        return _simulate_rank(0, hf_config, plan, workload, attn_implementation, real_tensors, job)
    worst: dict[str, int] = {}
    for pp_rank in range(plan.pp):
        # ranks are laid out (pp, dp_replicate, dp_shard, tp) row-major: this is the first rank of pp coordinate p
        rank = pp_rank * (plan.world_size // plan.pp)
        peak = _simulate_rank(rank, hf_config, plan, workload, attn_implementation, real_tensors, job)
        if peak["Total"] > worst.get("Total", -1):
            worst = {**peak, "pp_rank": pp_rank}
    return worst


def not_simulated(plan: Plan, real_tensors: bool = False, method: str = "full") -> str | None:
    """Why the simulator cannot measure a plan the trainer runs, or None: its own limits, not the trainer's."""
    if plan.backend == "deepspeed":
        return (
            "DeepSpeed's own step does not run on fake tensors (its ZeRO memory terms are checked against its real "
            "step instead: bench/deepspeed_memory.py)"
        )
    if plan.loss_parallel and not real_tensors:
        return "parallel.loss_parallel=true: fake tensors over-count torch's vocabulary-parallel cross-entropy"
    if plan.ep > 1:
        return (
            "parallel.ep: the all-to-all's split sizes are the routing's token counts, which fake tensors do not "
            "have (its numerics are tested on real ranks: tests/distributed/test_moe.py)"
        )
    return None


def _simulate_rank(
    rank: int, hf_config: Any, plan: Plan, workload: Workload, attn_implementation: str, real_tensors: bool, job: Job
) -> dict[str, int]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore  # importing it registers the "fake" backend

    # fp16 stores and computes what bf16 does; its loss-scale skip decision would need real gradient values
    precision = "bf16" if workload.mixed_precision == "fp16" else workload.mixed_precision
    device = torch.device("cpu")
    # the train keys that give the job its roles where the objective decides them (grpo's reference: a KL term)
    roles = job.objective.train_of_roles(workload.job.roles) if job.objective.train_of_roles else {}
    train = TrainConfig(
        global_batch_size=workload.global_batch_size, mixed_precision=precision, objective=workload.objective, **roles
    )
    real_inputs = job.task.real_inputs
    # what the forward reads the values of stays real (a VLM's token ids and image grids): fake ops take it
    fake_mode = None if real_tensors else FakeTensorMode(allow_non_fake_inputs=real_inputs is not None)
    options = BuildOptions(
        hf_config=hf_config,
        plan=plan,
        device=device,
        mixed_precision=precision,
        attn_implementation=attn_implementation,
        values="empty",
        fake_mode=fake_mode,
        method=workload.method,
        lora=AdapterConfig(r=workload.lora_rank, modules_to_save=list(workload.modules_to_save) or None),
        freeze=workload.frozen,
    )
    real_valued = real_inputs() if real_inputs is not None and fake_mode is not None else contextlib.nullcontext()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.world_size)
    try:
        engine = build_engine(
            options,
            train,
            make_optimizer=lambda params: build_optimizer(params, train),
            make_scheduler=lambda optimizer: build_scheduler(optimizer, train),
            objective=job.objective.make,
            roles=job.objective.attach,
        )
        assert isinstance(engine, TorchNativeEngine)  # DeepSpeed is refused above
        built = engine.built
        pipelined = isinstance(engine, PipelinedEngine)
        calls = _EachCallInAModuleOfItsOwn()
        if not pipelined:
            built.module = calls.of(built.forward_module)
        reference = getattr(engine, "reference", None)
        if isinstance(reference, LiveReference):  # a frozen copy's forward is a top-level call of its own too
            reference.forward = calls.of(reference.forward)
        accum = plan.grad_accum_steps(workload.global_batch_size)
        # a pipeline's schedule order (how many micro-batches are in flight) needs all of them; elsewhere two show
        # what the gradients kept between micro-steps add
        micro_steps = accum if pipelined else min(accum, 2)
        with fake_mode or contextlib.nullcontext(), real_valued, _unpacked_batches(), _static_pipeline_metadata():
            # the job's micro-batch (its objective's data where it has its own, else its task's) and what a global
            # batch of such counts
            batches, count = [], None
            for _ in range(micro_steps):
                batch, count = job.synthetic(hf_config, plan, workload, device)
                batches.append(batch)
            assert count is not None
            global_count = count(batches[0], workload, plan)
            cp_rank, cp_size = engine.sequence_slice  # rank 0's slice of each row under context parallelism
            if cp_size > 1:
                batches = [batch.sequence_slice(cp_rank, cp_size) for batch in batches]
            resident = _resident(engine, hf_config, plan, workload, device)  # made before the step, as the batches are
            inputs = [t for batch in batches for t in batch.tensors()] + resident
            train_step(engine, batches, global_count, train.grad_clip)  # warm-up, untracked (see the docstring)
            generated = _generation_peak(engine, hf_config, plan, workload, resident, device, calls)
            tracker = _tracker(engine, inputs)
            with tracker:
                train_step(engine, batches, global_count, train.grad_clip)
            snapshot = tracker.get_tracker_snapshot("peak")[device]
            peak = {str(getattr(k, "value", k)): int(v) for k, v in snapshot.items()}
            if generated is None:
                return peak
            # the step's peak is its larger phase; the categories are the training phase's
            return {**peak, "Training": peak["Total"], "Generation": generated, "Total": max(peak["Total"], generated)}
    finally:
        dist.destroy_process_group()


def _generation_peak(
    engine: TorchNativeEngine,
    hf_config: Any,
    plan: Plan,
    workload: Workload,
    resident: list[torch.Tensor],
    device: torch.device,
    calls: _EachCallInAModuleOfItsOwn,
) -> int | None:
    """The peak of the rollout that comes before the step's training (``generation_step.py``), or None for a step
    that reads its rows from data. Tracked on its own: the training state (parameters, optimizer states, what the
    engine keeps between steps) is there, the step's batches are not yet."""
    if workload.generation is None:
        return None
    from bigtrain.measure.generation_step import generation_step

    tracker = _tracker(engine, resident)  # a sharded reference's copy is there too
    with tracker:
        generation_step(engine, hf_config, workload, plan.dp, device, calls.of)
    return int(tracker.get_tracker_snapshot("peak")[device]["Total"])


def _reference_tensors(engine: TorchNativeEngine, plan: Plan, workload: Workload) -> list[torch.Tensor]:
    """The frozen reference copy's parameters on this device (``parallel.reference: sharded``): made before the
    step, so the tracker is handed them as it is the inputs. An offloaded copy's live in host memory (on this CPU
    the offload policy has nothing to move: they are left out, as a GPU's memory would not hold them)."""
    built = getattr(engine.reference, "keep", None)
    if built is None or reference_mode(plan, workload) != "sharded":
        return []
    local = [p.to_local() if isinstance(p, DTensor) else p for part in built.parts for p in part.parameters()]
    return [t.detach() for t in local]


def _resident(engine: TorchNativeEngine, hf_config: Any, plan: Plan, workload: Workload, device: Any) -> list[Any]:
    """What the job's roles hold on the device for the run: a sharded reference, the frozen parts."""
    return _reference_tensors(engine, plan, workload) + _frozen_part_tensors(hf_config, plan, workload, device)


def _frozen_part_tensors(hf_config: Any, plan: Plan, workload: Workload, device: torch.device) -> list[torch.Tensor]:
    """A text-to-image pipeline's frozen parts held on the device for the run (``parallel.frozen_parts: device``):
    their weights, one tensor each, in the dtype they run in on a GPU (the compute dtype: ``frozen_dtype``). Their
    encode runs before the step's forward and keeps nothing (``planner/frozen_parts.py``); offloaded parts live in
    host memory, and cached ones nowhere."""
    parts = getattr(hf_config, "frozen_parts", None)
    if not parts or placement_of(plan) != "device":
        return []
    dtype = frozen_dtype(torch.device("cuda"), workload.mixed_precision)  # a GPU's, as the planner weighs them
    return [torch.empty(int(params), dtype=dtype, device=device) for _, params, _ in parts]


def _tracker(engine: TorchNativeEngine, inputs: list[torch.Tensor]) -> MemTracker:
    """torch's memory tracker for what was built: FSDP2's own for an FSDP2 model, the plain one otherwise (holding
    the tensors that live outside the modules and the optimizer), and for pipeline stages one without per-module
    statistics."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import FSDPModule

    built = engine.built
    if isinstance(engine, PipelinedEngine):
        tracker: MemTracker = _HooklessMemTracker()
        tracker.track_external(*built.parts, *engine.optimizers, *inputs, *_receive_buffers(engine))
        if built.extra_tensors:
            tracker.track_external(*built.extra_tensors)
    elif isinstance(built.parts[0], FSDPModule):
        fsdp_tracker = type("FSDPMemTracker", (_FrozenParamsWithoutHooks, FSDPMemTracker), {})
        tracker = fsdp_tracker(built.parts[0], engine.optimizers[0])
        # what transforms allocated besides the model (a record's ModelStep) counts among the inputs: FSDP2's
        # tracker has no category for other tensors, and its track_external is a no-op
        tracker.track_inputs((*inputs, *built.extra_tensors))
    else:
        tracker = _MemTracker()
        tracker.track_external(built.parts[0], engine.optimizers[0], *built.extra_tensors, *inputs)
    return tracker


class _FrozenParamsWithoutHooks:
    """torch's trackers register a gradient hook on every parameter of a module they enter, which a frozen one (an
    adapter run's base) refuses: only trained parameters get one (a frozen parameter never has a gradient)."""

    def _track_module_params_and_buffers(self, module: torch.nn.Module, install_grad_hooks: bool = True) -> Any:
        from torch.distributed._tools.mem_tracker import _MemRefType

        memory = super()._track_module_params_and_buffers(module, install_grad_hooks=False)  # type: ignore[misc]
        handles = self._param_to_grad_hook_handles  # type: ignore[attr-defined]
        for param in module.parameters():
            if install_grad_hooks and param.requires_grad and handles.get(param) is None:

                def track(grad: torch.Tensor) -> None:
                    self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)  # type: ignore[attr-defined]

                handles[param] = (
                    param.register_hook(track),
                    param.register_post_accumulate_grad_hook(lambda p: track(p.grad)),
                )
        return memory


class _MemTracker(_FrozenParamsWithoutHooks, MemTracker):
    pass


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


class _EachCallInAModuleOfItsOwn:
    """Runs each top-level forward (the model's, once per micro-step; a frozen reference's) inside a module of its
    own, kept for the simulation.

    torch's memory tracker refuses a second top-level forward of one module within a step (it takes it for the next
    iteration), and clearing its per-module statistics between calls (``reset_mod_stats``) breaks a forward without
    a graph (the reference's), whose bookkeeping waits for the next backward. Called inside a fresh module, the
    model is a submodule used again, which the tracker allows; the device-wide peak, which is what is read, is the
    same either way.
    """

    class _Call(torch.nn.Module):
        def __init__(self, forward: Callable[..., Any]) -> None:
            super().__init__()
            self.run = forward

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.run(*args, **kwargs)

    def __init__(self) -> None:
        self.kept: list[torch.nn.Module] = []  # the tracker holds weak references to them until its backward

    def of(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        """``forward`` run inside a new module at each call."""

        def call(*args: Any, **kwargs: Any) -> Any:
            self.kept.append(self._Call(forward))
            return self.kept[-1](*args, **kwargs)

        return call


@contextlib.contextmanager
def _unpacked_batches() -> Iterator[None]:
    """Tell transformers' mask code what it would compute from real position ids: the batch is not packed."""
    import transformers.masking_utils as masking

    if not hasattr(masking, "find_packed_sequence_indices"):
        yield
        return
    with mock.patch.object(masking, "find_packed_sequence_indices", lambda position_ids: None):
        yield
