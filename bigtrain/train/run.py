"""One rank's whole job: validate -> process group -> plan -> model -> train -> summary.

Everything that can be wrong with the user's input is checked *before* the process group exists, identically on
every rank, so a bad recipe fails everywhere within seconds instead of leaving a peer waiting in a collective.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import torch
import torch.distributed as dist

from bigtrain.config.schema import ParallelConfig, RecipeConfig
from bigtrain.data.sources import TokenRows, load_token_rows
from bigtrain.errors import ConfigError
from bigtrain.models.build import load_hf_config
from bigtrain.parallel.apply import build_parallel_model
from bigtrain.parallel.runtime import (
    LaunchEnv,
    build_topology,
    init_process_group,
    pick_device,
    read_launch_env,
    smallest_free_memory,
    warn_if_accelerate_started_one_process,
)
from bigtrain.plan.auto import choose_plan
from bigtrain.plan.plan import Plan, resolve_plan
from bigtrain.train.metrics import format_bytes
from bigtrain.train.trainer import Trainer, TrainResult

log = logging.getLogger("bigtrain")


def run_training(cfg: RecipeConfig) -> TrainResult:
    env = read_launch_env()
    warn_if_accelerate_started_one_process(env)
    hf_config = load_hf_config(cfg.model)
    auto = cfg.parallel.plan == "auto"
    plan = None if auto else resolve_plan(cfg.parallel, env.world_size, cfg.train.global_batch_size)
    data = load_token_rows(cfg.data)
    if data.vocab_size is not None and data.vocab_size > hf_config.vocab_size:
        raise ConfigError(
            f"the tokenizer has {data.vocab_size} ids but the model's vocab_size is {hf_config.vocab_size}; "
            f"set model.config.vocab_size >= {data.vocab_size} or use a matching data.tokenizer"
        )
    device = pick_device(env)
    init_process_group(env, device, cfg.train.collective_timeout_s)
    try:
        if plan is None:
            plan = _auto_plan(cfg, hf_config, env, device, data.seq_len)
        result = _train(cfg, hf_config, plan, data, device)
        # The model and optimizer are gone (they lived in _train), but FSDP modules sit in reference cycles that hold
        # the process group's pending async work. Collect them now: left to interpreter shutdown, gloo's threads can
        # free those tensors after Python is gone and the process aborts.
        gc.collect()
        dist.barrier()  # let every rank finish its last collective before any rank tears the group down
        return result
    finally:
        dist.destroy_process_group()


def _auto_plan(cfg: RecipeConfig, hf_config: Any, env: LaunchEnv, device: torch.device, seq_len: int) -> Plan:
    """Plan from the hardware this job really has; every rank gets the same numbers, hence the same plan."""
    free = smallest_free_memory(env, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    chosen, table = choose_plan(
        {**hf_config.to_dict(), "model_type": hf_config.model_type},
        env.world_size,
        env.local_world_size,
        name,
        free,
        seq_len,
        cfg.train.global_batch_size,
        cfg.train.mixed_precision,
    )
    if env.rank == 0:
        log.info("parallel.plan=auto chose:\n%s", table)
    # validate it as if the user had written it
    return resolve_plan(ParallelConfig(**chosen.to_dict()), env.world_size, cfg.train.global_batch_size)


def _train(cfg: RecipeConfig, hf_config: Any, plan: Plan, data: TokenRows, device: torch.device) -> TrainResult:
    topology = build_topology(plan, device)
    rank = dist.get_rank()
    if rank == 0:
        log.info(
            "plan %s | %d rank(s) on %s | global batch %d = micro %d x dp %d x accum %d | %s",
            plan.to_dict(),
            dist.get_world_size(),
            device.type,
            cfg.train.global_batch_size,
            plan.micro_batch_size,
            plan.dp,
            plan.grad_accum_steps(cfg.train.global_batch_size),
            data.description,
        )
    model = build_parallel_model(cfg, hf_config, plan, topology, device)
    trainer = Trainer(cfg, model, data, topology, device, vocab_size=hf_config.vocab_size)
    result = trainer.fit()
    if rank == 0:
        peaks = ", ".join(format_bytes(p) for p in result.peak_mem_bytes)
        log.info(
            "done: %d steps, %s tokens in %.1f s (%s tokens/s); %s per rank: %s; outputs in %s",
            result.steps,
            f"{result.tokens:,}",
            result.seconds,
            f"{result.tokens / result.seconds:,.0f}",
            result.peak_mem_kind,
            peaks,
            cfg.output_dir,
        )
    return result
