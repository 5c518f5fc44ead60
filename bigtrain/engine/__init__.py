"""Engines: what the training loop drives (``base.Engine``), one file per implementation.

``build_engine`` is the only place that maps a plan to an engine: pipelined plans (pp > 1) to the pipelined engine,
DeepSpeed ZeRO plans to the DeepSpeed engine, every other plan the trainer runs (DDP, FSDP2, HSDP, with or without
tp) to the torch-native engine.
"""

from __future__ import annotations

from typing import Any

import torch

from bigtrain.config.deepspeed import deepspeed_config
from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.engine.base import Engine, StepResult, train_step
from bigtrain.engine.deepspeed_engine import DeepSpeedZeroEngine
from bigtrain.engine.pipelined import PipelinedEngine
from bigtrain.engine.torch_native import OptimizerFactory, SchedulerFactory, TorchNativeEngine
from bigtrain.errors import ConfigError
from bigtrain.parallel.apply import PipelineParts, build_parallel_model
from bigtrain.parallel.mesh import build_world_mesh

__all__ = ["Engine", "StepResult", "build_engine", "check_engine_inputs", "train_step"]


def check_engine_inputs(cfg: RecipeConfig, hf_config: Any, plan: Plan) -> None:
    """What the plan's engine reads besides the recipe, checked before any process group: DeepSpeed's JSON, and
    the recipe options the DeepSpeed engine does not take."""
    if plan.backend == "deepspeed":
        if cfg.train.compile:
            raise ConfigError(
                "train.compile=true compiles decoder blocks for the torch-native engines; the deepspeed backend does "
                "not compile them yet: set train.compile=false or use backend fsdp2"
            )
        deepspeed_config(cfg, plan, hf_config.hidden_size)


def build_engine(
    cfg: RecipeConfig,
    hf_config: Any,
    plan: Plan,
    device: torch.device,
    make_optimizer: OptimizerFactory,
    make_scheduler: SchedulerFactory,
) -> Engine:
    """The job's mesh, the model built and parallelised by the plan, and the engine that trains it.

    The optimizer and schedule come from the caller (the recipe's AdamW and warmup/cosine), so that every engine
    trains with the same ones.
    """
    if plan.backend == "deepspeed":
        return DeepSpeedZeroEngine.create(cfg, hf_config, plan, device, make_optimizer, make_scheduler)
    mesh = build_world_mesh(plan, device.type)
    model = build_parallel_model(
        hf_config,
        cfg.model.attn_implementation,
        plan,
        mesh,
        device,
        cfg.train.mixed_precision,
        cfg.model.name_or_path,
        cfg.train.seed,
        cfg.train.compile,
    )
    if isinstance(model, PipelineParts):
        return PipelinedEngine.create_pipelined(model, cfg.train, make_optimizer, make_scheduler, device)
    return TorchNativeEngine.create(model, cfg.train, make_optimizer, make_scheduler, device)
