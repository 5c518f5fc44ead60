"""A reward model laid out as the policy (``roles/rewards.RewardModel`` with its ``Layout``): sharded over an FSDP2
mesh, or partitioned by DeepSpeed ZeRO-3, each of 2 gloo ranks holds half of it, and scores its own completions as
the whole model on one process scores them."""

from __future__ import annotations

import gc
import os

import pytest
import torch
import torch.multiprocessing as mp
from helpers import free_port, save_reward_model

pytestmark = pytest.mark.full


# a policy's ZeRO-3 JSON as bigtrain fills it (its bf16 is the policy's: the reward model keeps its saved fp32)
ZERO3 = {
    "train_batch_size": 2,
    "train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
}


def _local_numel(model, layout: str) -> int:
    from torch.distributed.tensor import DTensor

    if layout == "deepspeed":  # ZeRO-3 keeps each parameter's partition in ds_tensor (the parameter itself is empty)
        return sum(p.ds_tensor.numel() for p in model.parameters())
    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters())


def _score_worker(rank: int, world: int, port: int, folder: str, texts: list[str], layout: str, results) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from bigtrain.roles.rewards import Layout, RewardModel

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if layout == "deepspeed":
            import deepspeed

            deepspeed.init_distributed(dist_backend="gloo", dist_init_required=False)
            how = Layout(deepspeed_config=ZERO3)
        else:
            how = Layout(mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",)))
        sharded = RewardModel(folder, torch.device("cpu"), how)
        assert next(sharded.model.parameters()).dtype == torch.float32  # its saved dtype, not the policy's bf16
        local = _local_numel(sharded.model, layout)
        mine = texts[rank::world]  # each rank its own completions, as the rollouts give them
        scores = sharded(prompts=["" for _ in mine], completions=mine, completion_ids=[[] for _ in mine])
        results.put((rank, local, scores, sharded.collective))
        del sharded
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("layout", ["fsdp2", "deepspeed"])
def test_each_rank_holds_half_and_scores_as_the_whole_model(tmp_path, layout):
    from bigtrain.roles.rewards import RewardModel

    folder = str(save_reward_model(tmp_path / "rm"))
    texts = ["3+4=7", "3+4=8", "12+30=42", "1+1=3 and more words", "9+9=18", "0+0=0"]
    whole = RewardModel(folder, torch.device("cpu"))
    assert not whole.collective
    total = sum(p.numel() for p in whole.model.parameters())
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(
        _score_worker, args=(2, free_port(), folder, texts, layout, results), nprocs=2, start_method="spawn"
    )
    got = sorted((results.get() for _ in range(2)), key=lambda r: r[0])
    for rank, local, scores, collective in got:
        assert collective
        assert local <= total // 2 + 1024  # each parameter's partition padded to a multiple of 2 ranks
        mine = texts[rank::2]
        expected = whole(prompts=["" for _ in mine], completions=mine, completion_ids=[[] for _ in mine])
        torch.testing.assert_close(torch.tensor(scores), torch.tensor(expected), rtol=1e-5, atol=1e-6)
