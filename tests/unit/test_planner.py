"""The analytic planner: ZeRO accounting, exact parameter counts, sensible picks, speed and bad input."""

from __future__ import annotations

import dataclasses

import pytest
from cases import COUNT_CHECK_MODELS
from helpers import make_plan

from bigtrain.api.request import parse_fix
from bigtrain.config.hf import hf_config_from_dict
from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.planner.explain import describe
from bigtrain.planner.hardware import GiB, lookup_gpu, make_cluster, parse_memory
from bigtrain.planner.memory import estimate_memory
from bigtrain.planner.model_stats import ModelStats, lm_preset_names, load_model_config
from bigtrain.planner.ranking import NEAR_TIE
from bigtrain.planner.search import search


def stats(name: str) -> ModelStats:
    return ModelStats.from_config(load_model_config(name))


def plan(**kw) -> Plan:
    return make_plan(**{"grad_reduce": "every_micro_step", **kw})


@pytest.mark.parametrize("n", [1, 2, 8, 64, 1024])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_model_states(n, stage):
    # the ZeRO paper's model states (sec. 3, bf16: 2Ψ params, 2Ψ grads, K = 12 for the fp32 master, m and v) where
    # DeepSpeed allocates them so (measured: bench/deepspeed_memory.py): ZeRO-1/2 hold the whole compute-dtype
    # model, ZeRO-3 a partition; all three partition the 12Ψ; the gradients are at least the paper's partition
    s = stats("llama-3-8b")
    psi = s.params
    # two tokens per sequence: the peak is a moment with gradients (the step, or the LM head's backward)
    m = estimate_memory(
        s,
        plan(backend="deepspeed", zero_stage=stage, dp_shard=n),
        Workload(seq_len=2, global_batch_size=n, mixed_precision="bf16"),
    )
    assert m.params_bytes == (2 * psi // n if stage == 3 else 2 * psi)
    assert m.optimizer_bytes == 12 * psi // n
    assert m.grads_bytes >= 2 * psi // n
    offloaded = estimate_memory(
        s,
        plan(backend="deepspeed", zero_stage=stage, dp_shard=n, offload_optimizer=True),
        Workload(seq_len=2, global_batch_size=n, mixed_precision="bf16"),
    )
    assert offloaded.optimizer_bytes == 0 and offloaded.total_bytes < m.total_bytes


def test_ddp_and_fsdp2_states():
    s = stats("gpt2")
    ddp = estimate_memory(
        s,
        plan(backend="ddp", zero_stage=0, dp_replicate=8),
        Workload(seq_len=1024, global_batch_size=8, mixed_precision="bf16"),
    )
    assert ddp.params_bytes + ddp.grads_bytes + ddp.optimizer_bytes == 16 * s.params
    # tiny activations, tied 50k vocabulary: the peak is the embedding's backward, with every gradient shard, three
    # vocab x hidden bf16 tensors (the tied weight's gradient, the embedding's new one, their sum), the first block's
    # fp32 reduce-scatter input, and the root unit gathered (the simulated step: 543 MiB, predicted 562)
    fsdp = estimate_memory(s, plan(dp_shard=8), Workload(seq_len=8, global_batch_size=8, mixed_precision="bf16"))
    assert fsdp.params_bytes + fsdp.optimizer_bytes == pytest.approx(12 * s.params / 8, rel=1e-6)
    vh = s.vocab * s.hidden
    expected = 4 * s.params / 8 + 2 * (2 * vh + s.embed_params) + 4 * s.block_params
    assert fsdp.grads_bytes == pytest.approx(expected, rel=1e-6)
    assert fsdp.other_bytes == 2 * s.root_params and fsdp.activations_bytes == 0
    # at the start of the loss backward this step's sharded gradients do not exist yet
    at_loss = estimate_memory(s, plan(dp_shard=8), Workload(seq_len=1024, global_batch_size=8, mixed_precision="bf16"))
    assert at_loss.grads_bytes == 0 and at_loss.activations_bytes > 0


PUBLISHED = {  # parameters reported by the model cards
    "llama-3-8b": 8.03e9,
    "llama-3-70b": 70.6e9,
    "llama-3-405b": 405.9e9,
    "mistral-7b": 7.24e9,
    "qwen2.5-0.5b": 0.494e9,
    "qwen2.5-7b": 7.62e9,
    "qwen2.5-72b": 72.7e9,
    "gpt2": 124.4e6,
    "gpt2-xl": 1.558e9,
    # measured families (block_probe.py); a mixture's total, its active count is tested in test_block_probe.py
    "mixtral-8x7b": 46.7e9,
    "qwen3-30b-a3b": 30.5e9,
    "deepseek-v3": 671e9,
    "gemma-2-9b": 9.24e9,
    "phi-3-mini": 3.82e9,
    "olmo-2-7b": 7.30e9,
    "pythia-6.9b": 6.86e9,
    # vision-language models: language model, vision tower and projector (their model cards' counts)
    "qwen2.5-vl-7b": 8.29e9,
    "gemma-3-4b": 4.30e9,
    "smolvlm": 2.25e9,
}


@pytest.mark.parametrize("name", lm_preset_names())  # classifiers: test_classifier_planner.py
def test_presets_have_their_published_size(name):
    assert stats(name).params == pytest.approx(PUBLISHED[name], rel=0.005)


@pytest.mark.parametrize("spec", COUNT_CHECK_MODELS, ids=lambda s: s["model_type"])
def test_counts_equal_the_numel_of_the_hf_model(spec):
    import torch
    from transformers import AutoModelForCausalLM

    cfg = load_model_config(spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config_from_dict(spec))
    assert ModelStats.from_config(cfg).params == sum(p.numel() for p in model.parameters())


def h100(n: int, per_node: int = 8):
    return make_cluster(n, per_node, "H100", "80GB")


def best(name, gpus, seq=2048, batch=None):
    return search(
        stats(name), h100(gpus), Workload(seq_len=seq, global_batch_size=batch or 64 * gpus, mixed_precision="bf16")
    )[0]


def test_small_model_on_8_gpus_replicates_without_checkpointing():
    c = best("gpt2", 8, seq=1024)
    assert c.fits
    assert (c.plan.backend == "ddp" or c.plan.zero_stage == 2) and c.plan.activation_checkpointing == "none"


def test_405b_on_64_gpus_is_planned_with_model_parallelism_and_runs_sharded_today():
    cands = search(
        stats("llama-3-405b"), h100(64), Workload(seq_len=2048, global_batch_size=512, mixed_precision="bf16")
    )
    best = cands[0]  # what bigtrain train runs and the planner offers: ZeRO-3 (FSDP2 or DeepSpeed) with offload
    assert best.fits and best.runnable and best.plan.zero_stage == 3
    assert best.plan.offload_params or best.plan.offload_optimizer
    # tp and pp are weighed too: among every fitting plan the fastest uses model parallelism (FSDP2 with tp), and
    # the plan offered is it or a simpler one within the near tie
    fastest = min((c for c in cands if c.fits), key=lambda c: c.time.step_s)
    assert fastest.runnable and (fastest.plan.tp > 1 or fastest.plan.pp > 1)
    assert best.time.step_s <= fastest.time.step_s * (1 + NEAR_TIE)
    # what the trainer cannot run says why, naming the key (e.g. "parallel.tp=2 runs with backend fsdp2 ...")
    deepspeed_tp = [c for c in cands if c.fits and c.plan.backend == "deepspeed" and c.plan.tp > 1]
    assert deepspeed_tp and all(c.unsupported.startswith("parallel.tp=") for c in deepspeed_tp)


def test_runnable_plans_rank_first_and_unrunnable_ones_say_why():
    cands = search(stats("llama-3-8b"), h100(8), Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16"))
    runnable = [c.runnable for c in cands]
    assert runnable == sorted(runnable, reverse=True)  # every runnable candidate precedes every other
    assert {c.plan.backend for c in cands if not c.runnable} >= {"deepspeed"}
    assert all(c.unsupported for c in cands if not c.runnable)
    assert cands[0].to_dict()["fits"] and cands[-1].to_dict()["rejected_because"].startswith("not runnable yet: ")


def test_8b_on_8_gpus_trains_with_fsdp2_alone_and_sharded_gradients():
    # the case: global batch of ~1M tokens, so many micro-steps; no tp/pp, no offload
    cands = search(stats("llama-3-8b"), h100(8), Workload(seq_len=2048, global_batch_size=512, mixed_precision="bf16"))
    assert cands[0].runnable and cands[0].fits
    plain = [
        c
        for c in cands
        if c.fits
        and c.runnable
        and c.plan.backend == "fsdp2"
        and c.plan.tp == c.plan.pp == 1
        and not c.plan.offload_params
    ]
    assert plain and all(c.plan.grad_accum_steps(512) > 1 for c in plain)
    assert {c.plan.grad_reduce for c in plain} >= {"every_micro_step"}
    # unsharded fp32 gradients between micro-steps: 4 bytes per parameter instead of 4/8, 26 GiB more for 8B
    # (less where the optimizer step, not the loss, is the peak)
    for c in plain:
        once = plan(**{**c.plan.to_dict(), "grad_reduce": "once_per_step"})
        extra = (
            estimate_memory(
                stats("llama-3-8b"), once, Workload(seq_len=2048, global_batch_size=512, mixed_precision="bf16")
            ).total_bytes
            - c.memory.total_bytes
        )
        if c.plan.grad_reduce == "every_micro_step":
            assert extra > 20 * GiB


def test_search_of_1024_gpus_weighs_every_layout_and_picks_a_plan_that_fits():
    # its speed is a benchmark, not a test: `bigtrain plan --model llama-3-405b --gpus 1024` is timed in
    # bench/results/plan_speed_cpu.md (a wall-time bound here failed on a busy 2-core CI machine)
    candidates = search(
        stats("llama-3-405b"), h100(1024), Workload(seq_len=4096, global_batch_size=2048, mixed_precision="bf16")
    )
    assert len(candidates) > 10000
    assert candidates[0].fits
    assert {c.plan.backend for c in candidates} >= {"fsdp2", "deepspeed", "ddp"}
    assert {c.plan.tp for c in candidates} >= {1, 2, 4, 8} and max(c.plan.pp for c in candidates) > 1


def test_tp_is_kept_within_a_node_and_dividing_heads():
    cands = search(
        stats("llama-3-8b"),
        h100(32),
        Workload(seq_len=2048, global_batch_size=256, mixed_precision="bf16"),
        fixed={"tp": 16},
    )
    assert all(not c.fits for c in cands)
    assert "tp=16 crosses node boundary (8 GPUs per node)" in {c.rejected_because for c in cands}
    cands = search(
        stats("qwen2.5-0.5b"),
        h100(8),
        Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16"),
        fixed={"tp": 4},
    )
    assert cands[0].rejected_because == "parallel.tp=4 does not divide num_attention_heads=14; try 1, 2"


def test_loss_parallel_comes_with_tp_unless_pinned_off_and_divides_the_logits():
    fixed = {"tp": 4, "pp": 1, "zero_stage": 3, "micro_batch_size": 2, "dp_replicate": 1, "sequence_parallel": False}
    fixed["activation_checkpointing"] = "none"
    work = Workload(seq_len=4096, global_batch_size=64, mixed_precision="bf16")
    weighed = search(stats("qwen2.5-7b"), h100(16), work, fixed=fixed)
    assert all(c.plan.loss_parallel for c in weighed if c.plan.backend == "fsdp2")
    plain = search(stats("qwen2.5-7b"), h100(16), work, fixed={**fixed, "loss_parallel": False})
    split = search(
        stats("qwen2.5-7b"),
        h100(16),
        Workload(seq_len=4096, global_batch_size=64, mixed_precision="bf16"),
        fixed={**fixed, "loss_parallel": True},
    )
    assert not any(c.plan.loss_parallel for c in plain) and all(c.plan.loss_parallel for c in split)
    same_plan = {c.plan: c.memory for c in plain}
    for c in split:
        saved = same_plan[dataclasses.replace(c.plan, loss_parallel=False)].total_bytes - c.memory.total_bytes
        # logits: 12 bytes per logit of the whole vocabulary -> 16 per local one (1/4); head parameters / 4
        b, L, V = 2, 4096, 152064
        assert saved >= b * L * V * (12 - 16 / 4)
    tied = search(
        stats("qwen2.5-0.5b"),
        h100(8),
        Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16"),
        fixed={"tp": 2, "loss_parallel": True},
    )
    assert {c.rejected_because for c in tied} == {
        "parallel.loss_parallel=true shards the LM head over the vocabulary, but this model ties it to the input "
        "embeddings (tie_word_embeddings=true), which stay whole; set parallel.loss_parallel=false"
    }


def test_sequence_parallel_comes_with_tp_unless_pinned_off_and_splits_the_norms_activations():
    fixed = {"tp": 4, "pp": 1, "zero_stage": 3, "micro_batch_size": 2, "dp_replicate": 1, "loss_parallel": False}
    fixed["activation_checkpointing"] = "none"
    plain = {
        c.plan: c
        for c in search(
            stats("llama-3-8b"),
            h100(16),
            Workload(seq_len=4096, global_batch_size=64, mixed_precision="bf16"),
            fixed={**fixed, "sequence_parallel": False},
        )
    }
    split = search(
        stats("llama-3-8b"),
        h100(16),
        Workload(seq_len=4096, global_batch_size=64, mixed_precision="bf16"),
        fixed={**fixed, "sequence_parallel": True},
    )
    assert split and all(c.plan.sequence_parallel and "tp=4+sp" in describe(c.plan) for c in split)
    for c in split:
        saved = plain[dataclasses.replace(c.plan, sequence_parallel=False)].memory.activations_bytes
        saved -= c.memory.activations_bytes
        # per norm and token 4h + ah + 4 bytes (fp32 input, rsqrt, normalised input) kept on 1/4 of the tokens:
        # two per block, the final norm, and the embeddings' output (ah)
        h, a, tokens = 4096, 2, 2 * 4096
        per_norm = (4 * h + a * h + 4) * tokens * 3 // 4
        assert saved == (2 * 32 + 1) * per_norm + a * h * tokens * 3 // 4


def test_fix_pins_fields():
    cands = search(
        stats("llama-3-8b"),
        h100(8),
        Workload(seq_len=2048, global_batch_size=64, mixed_precision="bf16"),
        fixed={"backend": "fsdp2", "zero_stage": 2},
    )
    assert {(c.plan.backend, c.plan.zero_stage) for c in cands} == {("fsdp2", 2)}


@pytest.mark.parametrize(
    "item, expected",
    [
        ("colour=red", "--fix 'colour=red': unknown plan field"),
        ("tp=two", "--fix tp='two' must be an integer"),
        ("tp=0", "--fix tp=0 must be at least 1"),
        ("backend=megatron", "--fix backend='megatron' is not allowed; use one of: ddp, fsdp2, deepspeed"),
        ("grad_reduce=sometimes", "--fix grad_reduce='sometimes' is not allowed; use one of: every_micro_step"),
        ("offload_params=maybe", "--fix offload_params='maybe' must be true or false"),
        ("tp=", "--fix tp= needs a value"),
        ("zero_stage=4", "--fix zero_stage=4 is not a stage of any backend; use 0 (ddp), 2, 3 (fsdp2), 1, 2, 3"),
    ],
)
def test_bad_fix(item, expected):
    with pytest.raises(ConfigError) as e:
        parse_fix([item])
    assert expected in str(e.value)


def test_fix_reads_values_as_a_recipe_does():
    assert parse_fix(["backend=fsdp2", "tp=2", "offload_params=true", "grad_reduce=once_per_step"]) == {
        "backend": "fsdp2",
        "tp": 2,
        "offload_params": True,
        "grad_reduce": "once_per_step",
    }


def test_bad_model_inputs(tmp_path):
    with pytest.raises(ConfigError, match="neither a preset nor a local model folder"):
        load_model_config("llama-9")
    (tmp_path / "config.json").write_text('{"model_type": "t5", "d_model": 32}')
    with pytest.raises(ConfigError, match="'t5' is not a causal language model"):
        load_model_config(str(tmp_path))


def test_memory_and_gpu_parsing():
    assert parse_memory("80GB") == 80 * GiB == parse_memory("80 GiB") == parse_memory("80g")
    assert parse_memory("1.5TB") == int(1.5 * 1024 * GiB)
    with pytest.raises(ConfigError, match="--gpu-memory 'lots' is not a size"):
        parse_memory("lots")
    assert lookup_gpu("NVIDIA A100-SXM4-40GB").name == "A100-40GB"
    assert lookup_gpu("NVIDIA H100 80GB HBM3").name == "H100"


@pytest.mark.parametrize("seq_len", [131072, 262144])
def test_long_rows_on_8_h100_get_a_fitting_plan_through_context_parallelism(seq_len):
    """Llama-3-8B, 8 x H100, 8 rows per step: no plan fit at 131,072 tokens before cp and the chunked loss; at
    262,144 (torchtitan's setting) too."""
    from bigtrain.planner.search import search

    stats = ModelStats.from_config(load_model_config("llama-3-8b"))
    workload = Workload(seq_len=seq_len, global_batch_size=8)
    best = search(stats, make_cluster(8, None, "H100", "80GB"), workload)[0]
    assert best.fits and best.runnable, best.rejected_because
    assert best.plan.cp > 1 and seq_len // best.plan.cp <= 65536


def test_a_long_row_that_fits_no_gpu_is_told_the_lever():
    """Llama-3-8B at 262,144 tokens on one H100: the way out names context parallelism over more GPUs."""
    from bigtrain.api.alternatives import alternatives_that_fit
    from bigtrain.api.planning import plan

    result = plan("llama-3-8b", gpus=1, gpu="H100", seq_len=262144, global_batch_size=1)
    assert not result.fits
    found = alternatives_that_fit(result.request)
    assert found["gpus"] == "2 GPUs (gpus=2: each row split over 2 of them, fix={'cp': 2})"  # as Python spells it


def test_one_gpu_reaches_long_rows_through_activation_offload_within_its_host_memory():
    """LoRA on Llama-3-8B, one H100, 196,608-token rows: no plan fits without activation offload (139,264 tokens is
    the longest, bench/longest_row.py), the best plan offloads them (host memory 256 GiB);
    with 8 GiB of host memory (less than the blocks' checkpointed inputs) none fits, and the table says why."""
    from bigtrain.planner.search import search

    stats = ModelStats.from_config(load_model_config("llama-3-8b"))
    workload = Workload(seq_len=196608, global_batch_size=1, method="lora")
    found = search(stats, make_cluster(1, None, "H100", "80GB"), workload)
    assert found[0].fits and found[0].runnable and found[0].plan.offload_activations
    assert not any(c.fits for c in found if not c.plan.offload_activations)
    small_host = search(stats, make_cluster(1, None, "H100", "80GB", host_memory="8GB"), workload)
    offloading = [c for c in small_host if c.plan.offload_activations and c.runnable]
    assert offloading and not any(c.fits for c in offloading)
    said = [c.rejected_because for c in offloading]
    assert any("of host memory per node for its offload > 8.0 GiB (--host-memory)" in r for r in said)
