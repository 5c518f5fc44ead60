"""Engines: what the training loop drives (``base.Engine``), one file per implementation.

``build_engine`` is the only place that maps a plan to an engine: the model comes from the one build path
(``parallel/build.py``), then DeepSpeed ZeRO plans get the DeepSpeed engine, pipelined plans (pp > 1) the pipelined
engine, and every other plan the trainer runs (DDP, FSDP2, HSDP, with or without tp) the torch-native engine, inside
the replica-sync engine when its replica groups synchronise every H steps (``parallel.sync``).
"""

from __future__ import annotations

from typing import Any

import torch

from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.deepspeed import deepspeed_config
from bigtrain.config.hf import resolve_attention
from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig, TrainConfig
from bigtrain.engine.base import Engine, StepResult, objective_of, train_step
from bigtrain.engine.deepspeed_engine import DeepSpeedZeroEngine
from bigtrain.engine.pipelined import PipelinedEngine
from bigtrain.engine.reference import attach_objective
from bigtrain.engine.replica_sync import ReplicaSyncEngine
from bigtrain.engine.torch_native import OptimizerFactory, SchedulerFactory, TorchNativeEngine
from bigtrain.errors import ConfigError
from bigtrain.parallel.build import build_model
from bigtrain.parallel.transforms.base import BuildOptions

__all__ = ["Engine", "StepResult", "build_engine", "build_options", "train_step"]


def _resolved(value: Any, key: str) -> Any:
    """A train option the planner decides under ``auto`` must be decided before the build (bigtrain train does)."""
    if value == "auto":
        raise ConfigError(f"{key}=auto is decided by the planner when the job starts; build with a chosen value")
    return value


def build_options(cfg: RecipeConfig, hf_config: Any, plan: Plan, device: torch.device) -> BuildOptions:
    """What the build reads of a recipe: the model, the plan, precision, compile, values and DeepSpeed's JSON (its
    template filled and checked against the recipe: a contradiction is a ConfigError, before any process group)."""
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
        deepspeed_config=deepspeed_config(cfg, plan, _width(hf_config)) if plan.backend == "deepspeed" else None,
    )


def _width(hf_config: Any) -> int:
    """The model's width, which sizes DeepSpeed's "auto" buckets (HF's own rule): a CNN's widest stage."""
    return int(getattr(hf_config, "hidden_size", None) or max(getattr(hf_config, "hidden_sizes", None) or [1024]))


def build_engine(
    options: BuildOptions, train: TrainConfig, make_optimizer: OptimizerFactory, make_scheduler: SchedulerFactory
) -> Engine:
    """The model built for ``options.plan``, and the engine that trains it.

    The optimizer and schedule come from the caller (the recipe's AdamW and warmup/cosine), so that every engine
    trains with the same ones; ``train`` gives the loss scaling of fp16.
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
    if train.label_smoothing and train.objective == "sft":  # the recipe's part of the objective (a classifier's)
        engine.objective = objective_of(built, train.label_smoothing)
    attach_objective(engine, options, train)  # dpo, ipo, orpo, simpo
    sync = settings_of(options.plan)
    if sync.semi_synchronous and options.values != "empty":  # the simulator measures one group's step
        assert isinstance(engine, TorchNativeEngine), "the table runs semi-synchronous plans on this engine only"
        engine = ReplicaSyncEngine(engine, sync, train.steps, options.replicas)
    return engine
