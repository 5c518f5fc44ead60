"""``python train_and_save.py RECIPE OUT.pt``: train this rank exactly as ``bigtrain train RECIPE`` does (under
torchrun), then write the trained parameters, each gathered whole, to OUT.pt from rank 0; rank 0 then writes the
final HF model from the last checkpoint as ``bigtrain train`` does.

The parameters come from the engine's own ``state_dict`` (the names a checkpoint would use), so the equivalence
tests compare the weights every plan ends with against a plain PyTorch loop, not only the logged losses. A pipeline
rank holds only its stages' parameters: rank 0 gathers every rank's.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from bigtrain.config.load import load_recipe
from bigtrain.runtime import init_process_group, pick_device, read_launch_env
from bigtrain.train.final_model import write_final_model
from bigtrain.train.run import TrainingJob


def main(*pairs: str) -> None:
    """``RECIPE OUT.pt`` pairs. One pair: the job starts and ends its process group, as ``bigtrain train`` does.
    Several: this script starts the group and the jobs run in it one after the other (a launch costs more than a
    tiny model's training); after each, ``OUT.pt.done<rank>`` marks that it finished on this rank."""
    jobs = list(zip(pairs[0::2], pairs[1::2], strict=True))
    if len(jobs) == 1:
        train_and_save(*jobs[0])
        return
    env = read_launch_env()
    init_process_group(env, pick_device(env), 300)
    try:
        for recipe, out in jobs:
            train_and_save(recipe, out)
            Path(f"{out}.done{env.rank}").write_text("ok\n")
    finally:
        gc.collect()  # as TrainingJob does before the group goes: gloo's pending work lives in module cycles
        dist.destroy_process_group()


def train_and_save(recipe: str, out: str) -> None:
    cfg = load_recipe(recipe)
    with TrainingJob(cfg) as job:
        result = job.fit()
        state = job.engine.state_dict()["model"]
        # every rank takes part in full_tensor's all-gather; only rank 0 writes
        full = {name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu() for name, t in state.items()}
        rank = dist.get_rank()
        parts = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(full, parts, dst=0)
        if rank == 0:
            torch.save({name: t for part in parts for name, t in part.items()}, out)
    if rank == 0:
        write_final_model(job.cfg, result, job.job)


if __name__ == "__main__":
    main(*sys.argv[1:])
