"""A recipe's ``parallel`` section made into a complete :class:`Plan` for a world size.

Resolution fills what the recipe leaves unset (the data-parallel degrees that fill the world, the backend's ZeRO
stage and gradient-reduction mode), checks the arithmetic (degrees that multiply to the world size), and asks the
capability table (``capabilities/``) whether the plan runs with the recipe's ``train`` options; the rows that need
the model are asked again at start-up, once its config is read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from bigtrain.config.capabilities import Setup, check, option_defaults
from bigtrain.config.hf import resolve_attention
from bigtrain.config.plan import DEFAULT_GRAD_REDUCE, ZERO_STAGES, Plan, divisor_hint
from bigtrain.config.schema import ParallelConfig, RecipeConfig, TrainConfig
from bigtrain.config.setup import DataFacts, JobFacts
from bigtrain.errors import ConfigError


def _data_parallel(cfg: ParallelConfig, dp_total: int) -> tuple[int, int]:
    """(dp_replicate, dp_shard): ddp replicates over all of dp, the sharded backends fill dp_shard. A degree the
    recipe states is kept as stated (the capability table judges it against the backend)."""
    replicate = None if cfg.dp_replicate in (None, -1) else cfg.dp_replicate
    shard = None if cfg.dp_shard in (None, -1) else cfg.dp_shard
    if cfg.backend == "ddp":
        shard = 1 if shard is None else shard
        return (dp_total // shard if replicate is None else replicate), shard
    replicate = 1 if replicate is None else replicate
    if shard is None:
        if dp_total % replicate:
            raise ConfigError(
                f"parallel.dp_replicate={replicate} does not divide the data-parallel world {dp_total}; "
                f"use one of {divisor_hint(dp_total)}"
            )
        shard = dp_total // replicate
    return replicate, shard


def _grad_reduce(cfg: ParallelConfig) -> str:
    if cfg.grad_reduce is not None:
        return cfg.grad_reduce
    # torch's PipelineStage turns FSDP's gradient sync off for every micro-batch and reduces once after the last
    return "once_per_step" if cfg.pp > 1 else DEFAULT_GRAD_REDUCE[cfg.backend]


def _check_ranges(cfg: ParallelConfig) -> None:
    for key in ("micro_batch_size", "tp", "pp", "cp", "ep", "pp_virtual_stages", "checkpoint_every"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"parallel.{key}={getattr(cfg, key)} must be at least 1")
    if cfg.loss_chunk_tokens < 0:
        raise ConfigError(
            f"parallel.loss_chunk_tokens={cfg.loss_chunk_tokens} must be 0 (no chunks) or a token count such as 4096"
        )
    for key in ("dp_replicate", "dp_shard"):
        value = getattr(cfg, key)
        if value is not None and value < 1 and value != -1:
            raise ConfigError(f"parallel.{key}={value} must be at least 1, or unset to fill the world")


def _plan(cfg: ParallelConfig, replicate: int, shard: int) -> Plan:
    return Plan(
        backend=cfg.backend,
        zero_stage=ZERO_STAGES[cfg.backend][-1] if cfg.zero_stage is None else cfg.zero_stage,
        grad_reduce=_grad_reduce(cfg),
        dp_replicate=replicate,
        dp_shard=shard,
        tp=cfg.tp,
        pp=cfg.pp,
        pp_schedule=cfg.pp_schedule,
        pp_virtual_stages=cfg.pp_virtual_stages,
        activation_checkpointing=cfg.activation_checkpointing,
        micro_batch_size=cfg.micro_batch_size,
        offload_optimizer=cfg.offload_optimizer,
        offload_params=cfg.offload_params,
        loss_parallel=cfg.loss_parallel,
        sequence_parallel=cfg.sequence_parallel,
        loss_chunk_tokens=cfg.loss_chunk_tokens,
        cp=cfg.cp,
        checkpoint_every=cfg.checkpoint_every,
        offload_activations=cfg.offload_activations,
        ep=cfg.ep,
        options=tuple(sorted({**dict(option_defaults()), **cfg.options}.items())),
    )


def parallel_of(fields: dict[str, object]) -> ParallelConfig:
    """A ``parallel`` section from plan fields (``Plan.to_dict``, pins): the schema's keys, and the records' options
    among them collected as the loader collects them."""
    own = {f.name for f in dataclasses.fields(ParallelConfig)}
    return ParallelConfig(
        **{k: v for k, v in fields.items() if k in own}, options={k: v for k, v in fields.items() if k not in own}
    )


def resolve_plan(cfg: ParallelConfig, world_size: int, train: TrainConfig, job: JobFacts | None = None) -> Plan:
    """The recipe's ``parallel`` section as a complete Plan for ``world_size`` ranks, or a ConfigError naming the key.

    ``train`` is the recipe's train section: its global batch must split into the plan's micro-batches, and its
    options (``compile``) take part in what may run; ``job``: the job's facts once its task and objective are
    resolved (their rows are asked too). What the recipe states contradicting itself (ddp with dp_shard,
    deepspeed with dp_replicate, ...) is said before the degrees' arithmetic, which it would only confuse."""
    if cfg.plan == "auto":
        raise ConfigError("parallel.plan=auto is chosen at start-up by the trainer (bigtrain/planner/auto.py)")
    _check_ranges(cfg)
    stated = _plan(cfg, _stated(cfg.dp_replicate), _stated(cfg.dp_shard))
    check(Setup(stated, train, job=job), kinds=("invalid", "not_built"))
    model_parallel = cfg.tp * cfg.pp * cfg.cp
    if world_size % model_parallel:
        cp = f" x parallel.cp={cfg.cp}" if cfg.cp > 1 else ""
        raise ConfigError(
            f"parallel.tp={cfg.tp} x parallel.pp={cfg.pp}{cp} = {model_parallel} does not divide the world size "
            f"{world_size}; use degrees whose product divides it ({divisor_hint(world_size)})"
        )
    replicate, shard = _data_parallel(cfg, world_size // model_parallel)
    product = replicate * shard * model_parallel
    if product != world_size:
        cp = f" x cp={cfg.cp}" if cfg.cp > 1 else ""
        raise ConfigError(
            f"parallel degrees dp_replicate={replicate} x dp_shard={shard} x tp={cfg.tp} x pp={cfg.pp}{cp} = "
            f"{product} do not match the world size {world_size}; make them multiply to {world_size} "
            "(or leave parallel.dp_shard unset to fill it)"
        )
    plan = _plan(cfg, replicate, shard)
    check(Setup(plan, train, job=job))
    return plan


def _stated(degree: int | None) -> int:
    """A degree as the recipe states it, 1 where it leaves it to fill the world."""
    return 1 if degree in (None, -1) else degree


def recipe_seq_len(cfg: RecipeConfig) -> int | None:
    """The rows' length a recipe trains on: data.seq_len, else a tokenised .npy's width (read from its header)."""
    if cfg.data.seq_len:
        return cfg.data.seq_len
    path = Path(cfg.data.path or "")
    if path.suffix == ".npy" and path.is_file():
        shape = np.load(path, mmap_mode="r").shape
        return int(shape[1]) if len(shape) == 2 else None
    return None


def recipe_data_facts(cfg: RecipeConfig, hf_config: Any) -> DataFacts | None:
    """What the capability table's data rows read, as far as the recipe says it without tokenising the data (the
    planner's and export's view; start-up asks again with what it read): the row length, packed documents (stated,
    or the default for chat and instruction records) and the attention that will run. None without a row length."""
    seq_len = recipe_seq_len(cfg)
    if seq_len is None:
        return None
    data = cfg.data
    packed = data.packing == "documents" or (data.packing is None and data.format in ("chat", "instruction"))
    return DataFacts(seq_len, packed, resolve_attention(hf_config, cfg.model.attn_implementation))
