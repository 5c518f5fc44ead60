"""The torch-native engine's state: keyed by HF parameter names whatever the wrappers, and restoring it into a fresh
engine continues training exactly as if nothing had happened (what the checkpoint issue builds on)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.multiprocessing as mp
from cases import TINY_LLAMA
from helpers import free_port, recipe_engine, save_rows


def _worker(rank: int, world: int, port: int, rows_path: str, parallel: list[str], results) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import dataclasses

    import torch.distributed as dist
    from torch.utils._pytree import tree_map

    from bigtrain.config.hf import hf_config_from_dict
    from bigtrain.config.load import load_recipe
    from bigtrain.config.resolve import resolve_plan
    from bigtrain.data.loader import StepLoader
    from bigtrain.data.order import GlobalOrder
    from bigtrain.data.sources import load_token_rows
    from bigtrain.engine import train_step
    from bigtrain.runtime import init_process_group, read_launch_env

    overrides = [f"data.path={rows_path}", "train.global_batch_size=8", "train.lr=1e-2", "train.warmup_steps=2"]
    cfg = load_recipe(None, overrides + [f"parallel.{p}" for p in parallel])
    cfg.model.config = dict(TINY_LLAMA)
    device = torch.device("cpu")
    init_process_group(read_launch_env(), device, timeout_s=60)
    try:
        plan = resolve_plan(cfg.parallel, world, cfg.train)
        hf_config = hf_config_from_dict(cfg.model.config)
        rows = load_token_rows(cfg.data)

        def make(seed: int):
            job = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))
            return recipe_engine(job, world, hf_config)[0]

        a = make(seed=0)
        order = GlobalOrder(len(rows.rows), cfg.train.global_batch_size, True, 0)
        loader = StepLoader(rows, a.dp_rank, a.dp_size, plan.micro_batch_size, device, order=order)

        def step(engine, k):
            batch = loader(k)
            tokens = engine.data_parallel_sum(batch.tokens)
            loss, result = train_step(engine, batch.micro_batches, tokens, cfg.train.grad_clip)
            return float(loss) / tokens, float(result.grad_norm), result.lr

        for k in range(2):
            step(a, k)
        saved = tree_map(
            lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v), a.state_dict()
        )
        b = make(seed=1)  # other initial weights: only the loaded state can make it continue like a
        b.load_state_dict(saved)
        continued = [step(a, k) for k in range(2, 4)]
        resumed = [step(b, k) for k in range(2, 4)]
        names = sorted(saved["model"])
        optimizer_keys = sorted(saved["optimizer"])
        results.put((rank, names, optimizer_keys, continued, resumed))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "parallel",
    [
        ["backend=fsdp2", "activation_checkpointing=full", "micro_batch_size=2"],
        pytest.param(["backend=ddp", "micro_batch_size=2"], marks=pytest.mark.full),
    ],
    ids=["fsdp2-ac-full", "ddp"],
)
def test_state_round_trip_continues_exactly(parallel, tmp_path):
    save_rows(tmp_path / "rows.npy", num_rows=40)
    world = 2
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(
        _worker,
        args=(world, free_port(), str(tmp_path / "rows.npy"), parallel, results),
        nprocs=world,
        start_method="spawn",
    )
    got = sorted((results.get() for _ in range(world)), key=lambda r: r[0])
    from transformers import AutoModelForCausalLM

    from bigtrain.config.hf import hf_config_from_dict

    with torch.device("meta"):
        hf_names = sorted(AutoModelForCausalLM.from_config(hf_config_from_dict(TINY_LLAMA)).state_dict())
    for _, names, optimizer_keys, continued, resumed in got:
        assert names == hf_names  # no FSDP, DDP ("module.") or checkpoint-wrapper prefixes
        # optimizer state keyed by parameter name, so it can follow the parameters to another plan
        assert "state.model.layers.0.mlp.up_proj.weight.exp_avg_sq" in optimizer_keys
        assert resumed == continued
        assert continued[-1][0] < continued[0][0] or continued[-1][2] != continued[0][2]  # it trained on
