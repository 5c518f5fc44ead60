"""The model transforms' contract, on one gloo rank: a transform added to the order is applied by every engine's
build; its rename keys values and checkpoints by HF names; its after-step hook runs after every optimizer step that
updated; and every transform names planner terms that exist (docs/architecture.md, "Adding a capability")."""

from __future__ import annotations

import functools
import gc
import importlib
import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from cases import TINY_LLAMA
from helpers import free_port, recipe_engine, save_tiny_model
from safetensors.torch import load_file
from torch import nn

import bigtrain.engine as engine_module
from bigtrain.config.load import load_recipe
from bigtrain.data.batch import MicroBatch
from bigtrain.engine import train_step
from bigtrain.parallel.build import build_model
from bigtrain.parallel.transforms import ORDER
from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform
from bigtrain.runtime import LaunchEnv, as_launched


class Holder(nn.Module):
    """Wraps the final norm: its parameter is then ``model.norm.inner.weight``."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def _wrap_final_norm(built: BuiltModel, ctx: BuildContext) -> None:
    for part in built.parts:
        part.base_model.norm = Holder(part.base_model.norm)


def _count_steps(built: BuiltModel) -> None:
    built.steps_seen = getattr(built, "steps_seen", 0) + 1


WRAP = Transform(
    name="wrap_final_norm",
    wanted=lambda options: True,
    apply=_wrap_final_norm,
    rename=lambda name: name.replace("norm.inner.", "norm."),
    after_step=_count_steps,
)
LOAD = next(i for i, t in enumerate(ORDER) if t.name == "load_values")
WITH_WRAP = (*ORDER[:LOAD], WRAP, *ORDER[LOAD:])  # before the values: they load through the rename


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    """One gloo group for every engine of the module: DeepSpeed keeps the groups it saw first for the process."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with as_launched(LaunchEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, launched=False)):
            yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "parallel",
    [
        ["parallel.backend=fsdp2", "parallel.activation_checkpointing=full"],
        ["parallel.backend=ddp"],
        ["parallel.backend=deepspeed", "parallel.zero_stage=2"],
        ["parallel.backend=deepspeed", "parallel.zero_stage=3", "parallel.activation_checkpointing=full"],
    ],
    ids=["fsdp2-checkpointed", "ddp", "deepspeed-zero2", "deepspeed-zero3-checkpointed"],
)
def test_a_transform_added_to_the_order_runs_in_every_engine(parallel, tmp_path, monkeypatch, one_rank_group):
    model_dir = save_tiny_model(tmp_path / "model", spec={**TINY_LLAMA, "tie_word_embeddings": False})
    saved = load_file(str(model_dir / "model.safetensors"))
    cfg = load_recipe(None, [f"model.name_or_path={model_dir}", "train.global_batch_size=2", *parallel])
    monkeypatch.setattr(engine_module, "build_model", functools.partial(build_model, transforms=WITH_WRAP))
    engine, plan = recipe_engine(cfg)
    assert "wrap_final_norm" in [t.name for t in engine.built.applied]
    state = engine.state_dict()
    assert "model.norm.weight" in state["model"] and not any("inner" in k for k in state["model"])
    norm = state["model"]["model.norm.weight"]
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    assert torch.equal(norm, saved["model.norm.weight"])  # the value came through the rename
    batches = [MicroBatch.of_ids(torch.randint(0, TINY_LLAMA["vocab_size"], (1, 16))) for _ in range(2)]
    for _ in range(2):
        train_step(engine, batches, 30.0, 1.0)
    assert engine.built.steps_seen == 2
    engine.load_state_dict(engine.state_dict())  # the renamed keys find their parameters again


# What changes no planner term: the values (no memory of their own); BatchNorm across ranks (a classifier's: the
# planner models causal LMs only, and its running statistics' all-reduce is a few KB). A new transform must name its
# terms or join this list.
NO_PLANNER_TERMS = {"load_values"}


@pytest.mark.parametrize("transform", ORDER, ids=lambda t: t.name)
def test_every_transform_names_planner_terms_that_exist(transform):
    assert bool(transform.planner_terms) == (transform.name not in NO_PLANNER_TERMS), transform.name
    for term in transform.planner_terms:
        module, function = term.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(f"bigtrain.planner.{module}"), function)), term


def _pipelined_worker(rank: int, port: int, model_dir: str, results) -> None:
    """One of two pipeline stages (pp=2) built with the extra transform: its rename and hook on a stage."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from bigtrain.runtime import init_process_group, read_launch_env

    cfg = load_recipe(None, [f"model.name_or_path={model_dir}", "parallel.pp=2", "train.global_batch_size=4"])
    device = torch.device("cpu")
    init_process_group(read_launch_env(), device, timeout_s=60)
    try:
        engine_module.build_model = functools.partial(build_model, transforms=WITH_WRAP)
        engine, _ = recipe_engine(cfg, world=2)
        batches = [MicroBatch.of_ids(torch.randint(0, TINY_LLAMA["vocab_size"], (1, 16))) for _ in range(4)]
        for _ in range(2):
            train_step(engine, batches, 60.0, 1.0)
        keys = sorted(engine.state_dict()["model"])
        engine.load_state_dict(engine.state_dict())
        results.put((rank, type(engine).__name__, engine.built.steps_seen, keys))
        del engine
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_transform_added_to_the_order_runs_on_pipeline_stages(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model", spec={**TINY_LLAMA, "tie_word_embeddings": False})
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_pipelined_worker, args=(free_port(), str(model_dir), results), nprocs=2, start_method="spawn")
    got = sorted(results.get() for _ in range(2))
    assert [(rank, kind, steps) for rank, kind, steps, _ in got] == [(0, "PipelinedEngine", 2), (1, "PipelinedEngine", 2)]
    last_stage_keys = got[1][3]
    assert "model.norm.weight" in last_stage_keys and not any("inner" in k for k in last_stage_keys)
