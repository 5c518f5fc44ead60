"""The reference model (``parallel.reference``): the role of the objectives measured against the policy as it starts.

The reference is the policy as training starts (the SFT model): its log-probability of each answer, taken before the
policy's forward of each micro-batch and never differentiated. Where it comes from is a plan choice
(``config/capabilities/reference.py``):
- ``adapter_disabled``: LoRA/QLoRA's own frozen base, the adapters switched off for one forward: no memory, one
  more forward per micro-batch;
- ``sharded``: a frozen copy built by the one build path, laid out as the policy's parameters (sharded by FSDP2 or
  ZeRO-3, whole on every rank under DDP and ZeRO-1/2), in the compute dtype (fp32 under DDP, as its policy computes);
- ``offloaded``: the same copy with its shards in host memory (FSDP2's CPU offload), copied in for its forward;
- ``precomputed``: one pass over the data before the first step (``reference_pass.py``), the log-probabilities
  stored beside the data: no model and no forward during training.
Each live reference runs its forward in eval mode (no dropout, as TRL's default ``disable_dropout``) under no_grad.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from bigtrain.config.capabilities.reference import REFERENCE, ROLE, resolved_reference
from bigtrain.config.schema import ADAPTER_METHODS, RecipeConfig, TrainConfig
from bigtrain.engine.base import Engine, Reference, evaluating
from bigtrain.errors import ConfigError
from bigtrain.losses.preference import sequence_logps
from bigtrain.parallel.build import build_model
from bigtrain.parallel.precision import COMPUTE_DTYPES
from bigtrain.parallel.transforms.base import BuildOptions, BuiltModel


@contextlib.contextmanager
def adapters_off(modules: list[nn.Module]) -> Iterator[None]:
    """peft's adapters bypassed in every adapted layer of ``modules`` (the frozen base alone computes), then back.
    peft's own ``enable_adapters(False)`` also flips the adapters' requires_grad, which FSDP2 and DeepSpeed have
    already taken into account; its layers read the same flag this sets."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for module in modules for m in module.modules() if isinstance(m, BaseTunerLayer)]
    before = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, was in zip(layers, before, strict=True):
            layer._disable_adapters = was


class LiveReference(Reference):
    """A forward that gives each row's answer log-probability: ``forward(batch)`` runs the model, ``switch`` makes it
    the reference (adapters off; nothing for a frozen copy), ``modules`` are put in eval mode around it."""

    def __init__(
        self,
        forward: Callable[[Any], Any],
        modules: list[nn.Module],
        switch: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
        keep: Any = None,
    ) -> None:
        self.forward, self.modules, self.switch = forward, modules, switch
        self.keep = keep  # what must live as long as the reference (its built model, its DeepSpeed engine)

    def attach(self, batch: Any) -> Any:
        if batch.ref_logps is not None:  # precomputed with the data
            return batch
        with evaluating(self.modules), self.switch():
            logits = self.forward(batch).logits
        own = getattr(batch, "reference_from", None)  # a batch that keeps more than each row's sum (per token)
        if own is not None:
            return batch.with_reference(own(logits))
        return batch.with_reference(sequence_logps(logits, batch.labels)[0].detach())


def frozen_copy(options: BuildOptions, offloaded: bool, mesh: Any) -> BuiltModel:
    """The reference as a frozen model of its own: the policy's build (same values: the same pretrained folder, or
    the same seeded initialisation) on the policy's mesh, with every parameter frozen, parameters resharded after
    forward (it has no backward), not compiled; ``offloaded``: its shards in host memory."""
    plan = options.plan
    if plan.backend == "fsdp2":
        plan = plan.but(zero_stage=3, offload_params=offloaded)
    ref = dataclasses.replace(options, plan=plan, method="full", compile=False, frozen=True)
    built = build_model(ref, mesh=mesh)
    for part in built.parts:
        if isinstance(part, FSDPModule):  # the root unit too (the policy keeps its root gathered for backward)
            part.set_reshard_after_forward(True)
    return built


def inference_engine(module: nn.Module, policy_config: dict[str, Any], **overrides: Any) -> Any:
    """An inference-only DeepSpeed engine over a frozen ``module`` with the policy's ZeRO settings (its hooks gather
    each module's parameters for its forward): no optimizer or schedule; ``overrides`` replace config sections."""
    import deepspeed

    config = {k: v for k, v in policy_config.items() if k not in ("optimizer", "scheduler")}
    module, *_ = deepspeed.initialize(model=module, config={**config, **overrides}, dist_init_required=False)
    return module


def _frozen_forward(built: BuiltModel, options: BuildOptions) -> tuple[Callable[[Any], Any], Any]:
    """How the frozen copy runs one micro-batch, and what keeps it alive: ZeRO-3's partitioned copy through an
    inference-only DeepSpeed engine (its hooks gather each module's parameters), ZeRO-1/2's whole copy cast to the
    compute dtype (as DeepSpeed casts the policy), the others under the autocast of their build."""
    module = built.forward_module
    dtype = COMPUTE_DTYPES[options.mixed_precision]
    if options.plan.backend == "deepspeed":
        if options.partitioned_construction:
            assert options.deepspeed_config is not None
            module = inference_engine(module, options.deepspeed_config)
        elif dtype is not None:
            module.to(dtype)

        def ds_forward(batch: Any) -> Any:
            return module(**batch.model_inputs())

        return ds_forward, module
    autocast = built.autocast_dtype
    device = options.device

    def forward(batch: Any) -> Any:
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            return module(**batch.model_inputs())

    return forward, built


def attach_reference(engine: Engine, options: BuildOptions, train: TrainConfig) -> None:
    """The reference (``parallel.reference``) of an objective that has the role, on ``engine``: for adapter_disabled
    the engine's own forward of the policy with the adapters switched off around it, for sharded and offloaded a
    frozen copy; nothing for precomputed (the data carries it: ``reference_pass.py``)."""
    policy: BuiltModel = engine.built  # type: ignore[attr-defined]  # every engine that runs them keeps it
    mode = resolved_reference(options.plan, (ROLE,), train.method)
    if mode == "precomputed":
        return
    parts = list(policy.parts)
    if mode == "adapter_disabled":
        engine.reference = LiveReference(engine.model_output, parts, lambda: adapters_off(parts))
        return
    assert mode in ("sharded", "offloaded"), mode
    copy = frozen_copy(options, offloaded=mode == "offloaded", mesh=policy.mesh)
    forward, keep = _frozen_forward(copy, options)
    engine.reference = LiveReference(forward, copy.parts, keep=keep)


def check_reference(cfg: RecipeConfig) -> None:
    """What the capability table cannot see of a recipe with a reference: the lora section. Modules trained fully
    beside the adapters (lora.modules_to_save) are updated in place, so switching the adapters off no longer gives the
    starting model: the adapter-disabled reference (asked, or auto's choice for a written plan) is refused;
    ``plan: auto`` does not weigh it (``config/capabilities/reference.py``)."""
    if not cfg.lora.modules_to_save:
        return
    asked = cfg.parallel.options.get(REFERENCE.name, REFERENCE.default)
    adapters = cfg.train.method in ADAPTER_METHODS
    if asked == "adapter_disabled" or (asked == "auto" and adapters and cfg.parallel.plan != "auto"):
        raise ConfigError(
            f"parallel.reference={asked} with lora.modules_to_save={cfg.lora.modules_to_save}: those modules train "
            "fully, so the adapters switched off are no longer the starting model; set parallel.reference="
            "precomputed, or unset lora.modules_to_save"
        )


def engine_parts(engine: Engine) -> list[nn.Module]:
    """The HF models an engine trains (the engines that run preference objectives all keep their built model)."""
    return list(engine.built.parts)  # type: ignore[attr-defined]
