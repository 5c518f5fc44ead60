"""Engines: what the training loop drives (``base.Engine``), one file per implementation.

``build_engine`` is the only place that maps a plan to an engine: the model comes from the one build path
(``parallel/build.py``), then DeepSpeed ZeRO plans get the DeepSpeed engine, pipelined plans (pp > 1) the pipelined
engine, and every other plan the trainer runs (DDP, FSDP2, HSDP, with or without tp) the torch-native engine; a
capability record may wrap it (``Capability.engine``: the replica-sync engine when replica groups synchronise every
H steps, ``parallel.sync``). The engine minimises what the job's objective makes for the built model, and the
objective's roles attach to it (a reference model): the engines never learn which objective runs.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

import torch

from bigtrain.config.capabilities import CAPABILITIES
from bigtrain.config.deepspeed import bucket_width, deepspeed_config
from bigtrain.config.hf import resolve_attention
from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig, TrainConfig
from bigtrain.engine.base import Engine, StepResult, train_step
from bigtrain.engine.deepspeed_engine import DeepSpeedZeroEngine
from bigtrain.engine.pipelined import PipelinedEngine
from bigtrain.engine.torch_native import OptimizerFactory, SchedulerFactory, TorchNativeEngine
from bigtrain.errors import ConfigError
from bigtrain.losses import Objective
from bigtrain.parallel.build import build_model
from bigtrain.parallel.transforms.base import BuildOptions, BuiltModel

# the job's objective: its loss for a built model and the recipe's train section (``ObjectiveSpec.make``), and its
# roles attached to the engine (``ObjectiveSpec.attach``)
MakeObjective = Callable[[BuiltModel, TrainConfig], Objective]
AttachRoles = Callable[[Engine, BuildOptions, TrainConfig], None]

__all__ = ["Engine", "StepResult", "build_engine", "build_options", "train_step"]


def _resolved(value: Any, key: str) -> Any:
    """A train option the planner decides under ``auto`` must be decided before the build (bigtrain train does)."""
    if value == "auto":
        raise ConfigError(f"{key}=auto is decided by the planner when the job starts; build with a chosen value")
    return value


def build_options(
    cfg: RecipeConfig, hf_config: Any, plan: Plan, device: torch.device, new_head: bool = False
) -> BuildOptions:
    """What the build reads of a recipe: the model, the plan, precision, compile, values and DeepSpeed's JSON (its
    template filled and checked against the recipe: a contradiction is a ConfigError, before any process group);
    ``new_head``: the pretrained head does not fit the data (its task's ``Prepared.new_head``)."""
    return BuildOptions(
        hf_config=hf_config,
        plan=plan,
        device=device,
        mixed_precision=cfg.train.mixed_precision,
        attn_implementation=resolve_attention(hf_config, cfg.model.attn_implementation),
        compile=_resolved(cfg.train.compile, "train.compile"),
        fp8=_resolved(cfg.train.fp8, "train.fp8"),
        method=cfg.train.method,
        lora=cfg.lora,
        pretrained=cfg.model.name_or_path,
        seed=cfg.train.seed,
        freeze=tuple(cfg.model.freeze),
        new_head=new_head,
        deepspeed_config=deepspeed_config(cfg, plan, bucket_width(hf_config)) if plan.backend == "deepspeed" else None,
    )


def build_engine(
    options: BuildOptions,
    train: TrainConfig,
    make_optimizer: OptimizerFactory,
    make_scheduler: SchedulerFactory,
    objective: MakeObjective,
    roles: AttachRoles | None = None,
) -> Engine:
    """The model built for ``options.plan``, and the engine that trains it.

    The optimizer and schedule come from the caller (the recipe's AdamW and warmup/cosine), so that every engine
    trains with the same ones; ``train`` gives the loss scaling of fp16. ``objective`` makes the loss for the built
    model, and ``roles`` attaches what the objective needs besides it (the job's: ``ObjectiveSpec.make``,
    ``ObjectiveSpec.attach``).
    """
    built = build_model(options)
    engine: Engine
    if options.plan.backend == "deepspeed":
        assert options.deepspeed_config is not None
        config = options.deepspeed_config
        engine = DeepSpeedZeroEngine.create(built, config, make_optimizer, make_scheduler, options.device)
    elif options.plan.pp > 1:
        engine = PipelinedEngine.create_pipelined(built, train, make_optimizer, make_scheduler, options.device)
    else:
        engine = TorchNativeEngine.create(built, train, make_optimizer, make_scheduler, options.device)
    engine.objective = objective(built, train)
    if roles is not None:
        roles(engine, options, train)
    for capability in CAPABILITIES:  # a record whose plans run inside an engine of its own (replica groups)
        if capability.engine is not None:
            engine = import_module(capability.engine).wrap(engine, options, train)
    return engine
