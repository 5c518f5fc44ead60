"""Activation offload (``parallel.offload_activations``): the round trip through host memory gives the same loss and
gradients as keeping everything on the device (alone, under full checkpointing and every-other-block checkpointing),
a wrong copy would be caught, what is copied at a real width is what the planner's host term counts, and the start-up
check, the time term and the capability rows say what they should. Multi-rank runs against the single-process loop
are in tests/distributed (test_equivalence.py, test_context_parallel.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from cases import TINY_LLAMA
from helpers import make_plan
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

from bigtrain.config.capabilities import ModelFacts, Setup, check
from bigtrain.config.hf import hf_config_from_dict
from bigtrain.config.plan import Plan
from bigtrain.config.schema import TrainConfig
from bigtrain.errors import ConfigError
from bigtrain.parallel.transforms import activation_offload
from bigtrain.parallel.transforms.activation_offload import ActivationOffloader, OffloadedBlock
from bigtrain.planner.cost import activation_offload_seconds
from bigtrain.planner.hardware import make_cluster
from bigtrain.planner.memory_terms import GiB, offloaded_block_bytes
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.train.checks import check_offload_host_memory

ROWS, SEQ = 2, 24


def _plan(**changes) -> Plan:
    """An offloading FSDP2 plan over 8 ranks, with ``changes``."""
    return make_plan(**{"dp_shard": 8, "offload_activations": True, **changes})


def _model(config=TINY_LLAMA):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(hf_config_from_dict(config), attn_implementation="sdpa")


def _offloaded(model, ac: str, every: int = 1, host: str = "cpu"):
    """The model with every block wrapped as the transforms wrap it: checkpointed (every ``every``-th), then
    offloaded."""
    offloader = ActivationOffloader(torch.device(host))
    layers = model.model.layers
    for index, block in enumerate(layers):
        if ac == "full" and index % every == 0:
            block = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False)
        layers[index] = OffloadedBlock(block, offloader)
    return model, offloader


def _loss_and_grads(model):
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (ROWS, SEQ), generator=torch.Generator().manual_seed(1))
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    strip = "_checkpoint_wrapped_module."
    return loss.detach(), {n.replace(strip, ""): p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("ac, every", [("none", 1), ("full", 1), ("full", 2)])
def test_the_round_trip_gives_the_same_loss_and_gradients(ac, every):
    reference = _model()
    loss, grads = _loss_and_grads(reference)
    model, offloader = _offloaded(copy.deepcopy(reference), ac, every)
    got, got_grads = _loss_and_grads(model)
    torch.testing.assert_close(got, loss, rtol=0, atol=0)
    assert got_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=0, atol=1e-7, msg=name)
    hidden, layers = TINY_LLAMA["hidden_size"], TINY_LLAMA["num_hidden_layers"]
    block_input = ROWS * SEQ * hidden * 4  # fp32
    if ac == "full" and every == 1:
        assert offloader.copied_bytes == layers * block_input  # exactly the checkpointed blocks' inputs
    else:
        assert offloader.copied_bytes > layers * block_input  # everything the (other) blocks save


def test_a_wrong_copy_would_be_caught(monkeypatch):
    """Host copies that come back as zeros change the gradients far beyond the 1e-7 the round trip keeps."""
    reference = _model()
    _, grads = _loss_and_grads(reference)
    monkeypatch.setattr(ActivationOffloader, "_copy_out", lambda self, tensor: torch.zeros_like(tensor))
    model, _ = _offloaded(copy.deepcopy(reference), "none")
    _, got_grads = _loss_and_grads(model)
    worst = max(float((got_grads[n] - g).abs().max()) for n, g in grads.items())
    assert worst > 1e-3


def _real_width(layers: int = 2) -> dict:
    config = dict(load_model_config("llama-3-8b"))
    config["num_hidden_layers"] = layers
    return config


@pytest.mark.parametrize("ac", ["none", "full"])
def test_what_is_copied_at_llama_3_8b_width_is_the_planners_host_term(ac):
    """On fake tensors (no memory, no arithmetic), bf16, 4096 tokens: everything a block saves (the planner's block
    term; RoPE's cos and sin tables, 0.25% more, are not in it) or each checkpointed block's input."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    config, tokens = _real_width(), 4096
    with FakeTensorMode():
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = _model(config)
        finally:
            torch.set_default_dtype(torch.float32)
        model, offloader = _offloaded(model, ac, host="meta")
        model(input_ids=torch.randint(0, 1000, (1, tokens)))
    stats = ModelStats.from_config(config)
    predicted = offloaded_block_bytes(stats, _plan(activation_checkpointing=ac), tokens, 2, stats.layers)
    assert offloader.copied_bytes == pytest.approx(predicted, rel=0.01)


def test_too_little_host_memory_is_one_line_naming_the_key():
    hf_config = hf_config_from_dict(load_model_config("llama-3-8b"))
    plan = _plan(dp_shard=8)
    check_offload_host_memory(plan, hf_config, 8192, 2, 8, 2048 * GiB)  # a DGX's 2 TiB holds it
    with pytest.raises(ConfigError, match="parallel.offload_activations=true keeps .* GiB per rank") as error:
        check_offload_host_memory(plan, hf_config, 131072, 2, 8, 512 * GiB)
    assert "activation_checkpointing: full" in str(error.value) and "\n" not in str(error.value)
    check_offload_host_memory(_plan(offload_activations=False), hf_config, 131072, 2, 8, 0)  # nothing offloaded


def test_the_copies_hide_behind_long_compute_and_show_behind_short():
    stats = ModelStats.from_config(load_model_config("llama-3-8b"))
    cluster = make_cluster(8, 8, "H100")
    plan = _plan()
    moved = 2 * offloaded_block_bytes(stats, plan, 8192, 2, stats.layers) / (cluster.gpu.pcie_gbps * 1e9)
    assert activation_offload_seconds(stats, plan, cluster, 8192, 2, 1, compute=100.0) == 0.0
    assert activation_offload_seconds(stats, plan, cluster, 8192, 2, 1, compute=0.0) == pytest.approx(moved)
    assert activation_offload_seconds(stats, _plan(offload_activations=False), cluster, 8192, 2, 1, 0.0) == 0.0


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(activation_checkpointing="selective"), "with activation_checkpointing=selective is not built"),
        (dict(pp=2, dp_shard=4), "with parallel.pp > 1 is not built yet"),
    ],
)
def test_what_offload_does_not_combine_with_is_refused(changes, says):
    facts = ModelFacts.of(hf_config_from_dict(TINY_LLAMA))
    with pytest.raises(ConfigError, match=says):
        check(Setup(_plan(**changes), TrainConfig(global_batch_size=8), facts))


def test_parameters_and_small_tensors_stay_on_the_device(monkeypatch):
    """Saved weights (the transposed views the matmuls keep) are not copied: FSDP2 and ZeRO-3 gather them again."""
    copied = []
    original = ActivationOffloader._copy_out

    def record(self, tensor):
        copied.append(tensor)
        return original(self, tensor)

    monkeypatch.setattr(ActivationOffloader, "_copy_out", record)
    model, _ = _offloaded(_model(), "none")
    _loss_and_grads(model)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert copied and not any(t.untyped_storage().data_ptr() in weights for t in copied)
    assert min(t.numel() * t.element_size() for t in copied) >= activation_offload.MIN_BYTES
