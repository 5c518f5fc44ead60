"""``python train_and_save.py RECIPE OUT.pt``: train this rank exactly as ``bigtrain train RECIPE`` does (under
torchrun), then write the trained parameters, each gathered whole, to OUT.pt from rank 0; rank 0 then writes the
final HF model from the last checkpoint as ``bigtrain train`` does.

The parameters come from the engine's own ``state_dict`` (the names a checkpoint would use), so the equivalence
tests compare the weights every plan ends with against a plain PyTorch loop, not only the logged losses. A pipeline
rank holds only its stages' parameters: rank 0 gathers every rank's.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from bigtrain.config.load import load_recipe
from bigtrain.train.run import TrainingJob, write_final_model


def main(recipe: str, out: str) -> None:
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
        write_final_model(cfg, result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
