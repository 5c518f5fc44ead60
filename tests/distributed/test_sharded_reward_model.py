"""A reward model laid out as an FSDP2 policy (``roles/rewards.RewardModel`` with the policy's mesh): each of 2 gloo
ranks holds half of it, and scores its own completions as the whole model on one process scores them."""

from __future__ import annotations

import gc
import os

import pytest
import torch
import torch.multiprocessing as mp
from helpers import free_port, save_reward_model

pytestmark = pytest.mark.full


def _score_worker(rank: int, world: int, port: int, folder: str, texts: list[str], results) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from bigtrain.roles.rewards import RewardModel

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
        sharded = RewardModel(folder, torch.device("cpu"), mesh)
        local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in sharded.model.parameters())
        mine = texts[rank::world]  # each rank its own completions, as the rollouts give them
        scores = sharded(prompts=["" for _ in mine], completions=mine, completion_ids=[[] for _ in mine])
        results.put((rank, local, scores, sharded.collective))
        del sharded
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_each_rank_holds_half_and_scores_as_the_whole_model(tmp_path):
    from bigtrain.roles.rewards import RewardModel

    folder = str(save_reward_model(tmp_path / "rm"))
    texts = ["3+4=7", "3+4=8", "12+30=42", "1+1=3 and more words", "9+9=18", "0+0=0"]
    whole = RewardModel(folder, torch.device("cpu"))
    assert not whole.collective
    total = sum(p.numel() for p in whole.model.parameters())
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_score_worker, args=(2, free_port(), folder, texts, results), nprocs=2, start_method="spawn")
    got = sorted((results.get() for _ in range(2)), key=lambda r: r[0])
    for rank, local, scores, collective in got:
        assert collective
        assert local <= total // 2 + 1024  # FSDP pads each parameter's first dimension to a multiple of 2
        mine = texts[rank::2]
        expected = whole(prompts=["" for _ in mine], completions=mine, completion_ids=[[] for _ in mine])
        torch.testing.assert_close(torch.tensor(scores), torch.tensor(expected), rtol=1e-5, atol=1e-6)
