"""Engine details found on a real GPU (bench/results/rank0_h200.md), checked here on one CPU rank.

- DDP keeps its gradients inside its communication buckets between optimizer steps: zeroing them must not free
  them, or the next step's first micro-step (under ``no_sync``) allocates a second full set beside the buckets.
- ``train.compile`` compiles every decoder block in place (parameter names, hence checkpoints, unchanged).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from cases import TINY_LLAMA
from helpers import free_port, recipe_engine

from bigtrain.config.hf import hf_config_from_dict
from bigtrain.config.load import load_recipe
from bigtrain.data.batch import MicroBatch
from bigtrain.engine import train_step


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def make_engine(overrides: list[str]):
    cfg = load_recipe(None, ["train.global_batch_size=4", *overrides])
    cfg.model.config = dict(TINY_LLAMA)
    return recipe_engine(cfg, hf_config=hf_config_from_dict(cfg.model.config))


def test_ddp_gradients_stay_in_its_buckets_between_steps():
    with one_rank_group():
        engine, plan = make_engine(["parallel.backend=ddp", "parallel.micro_batch_size=2"])
        assert plan.grad_accum_steps(4) == 2  # the first micro-step runs under no_sync
        batches = [MicroBatch.of_ids(torch.randint(0, TINY_LLAMA["vocab_size"], (2, 16))) for _ in range(2)]
        params = [p for p in engine.built.forward_module.parameters() if p.requires_grad]
        for _ in range(2):  # DDP rebuilds its buckets (in gradient-ready order) after the first step
            train_step(engine, batches, 64.0, 1.0)
        buckets = {p.grad.untyped_storage().data_ptr() for p in params}
        assert len(buckets) < len(params)  # views of a few flat buckets, not one storage per parameter

        seen: set[int] = set()
        hooks = [
            p.register_post_accumulate_grad_hook(lambda p: seen.add(p.grad.untyped_storage().data_ptr()))
            for p in params
        ]
        train_step(engine, batches, 64.0, 1.0)
        for hook in hooks:
            hook.remove()
        assert seen and seen <= buckets, "a micro-step accumulated gradients outside DDP's buckets"


@pytest.mark.parametrize("ac", ["none", "full"])
def test_compile_compiles_every_decoder_block_in_place(ac: str):
    with one_rank_group():
        engine, _ = make_engine(["train.compile=true", f"parallel.activation_checkpointing={ac}"])
        model = engine.parts[0]
        blocks = list(model.model.layers)
        assert len(blocks) == TINY_LLAMA["num_hidden_layers"]
        assert all(block._compiled_call_impl is not None for block in blocks)
        assert engine.built.compile_loss  # the loss runs compiled too (tests/unit/test_compiled_loss.py)
        names = [n for n, _ in model.named_parameters()]
        assert not any("_orig_mod" in n for n in names)
        plain, _ = make_engine([f"parallel.activation_checkpointing={ac}"])
        assert names == [n for n, _ in plain.parts[0].named_parameters()]
        assert all(block._compiled_call_impl is None for block in plain.parts[0].model.layers)
        assert not plain.built.compile_loss
