"""The GPU tier (``python -m pytest -m gpu``; skipped without CUDA): the paths CPU CI cannot reach, each held to a
plain loop on the same GPU or to its CPU twin, with assertions.

- FP8 with FSDP2's float8 all-gather and the per-step scale hook, against torchao's float8 linears in a plain loop;
- torch.compile on full fine-tuning, against eager, each step from identical weights;
- activation offload's pinned host buffers and CUDA side stream, against the same plan without offload;
- QLoRA's NF4 base on CUDA, against torchao's own quantisation and the CPU twin's steps;
- ``plan: auto``'s detection of this GPU;
- rank 0 of an 8-GPU FSDP2 job (fake group, bench/rank0_on_device.py) against the planner's peak memory.
Results of a lent GPU go to bench/results/gpu_tier_*.md with the command that made them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from cases import TINY_LLAMA
from helpers import REPO, save_tiny_model
from single_rank import PlainLoop, compare_step_by_step, one_rank, recipe, token_batches, torchao_float8

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda", 0)
STEPS = 10


@pytest.fixture(autouse=True)
def no_tf32():
    """fp32 means fp32 on both sides (bigtrain leaves TF32 off; a test must not inherit it switched on)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def _report(name: str, rows: list[dict]) -> None:
    worst = {k: max(r[k] for r in rows) for k in ("loss_rel", "grad_norm_rel", "param_abs")}
    print(f"{name}: worst over {len(rows)} steps {json.dumps(worst)}; losses {[round(r['loss'], 4) for r in rows]}")


def test_compile_matches_eager_step_by_step():
    raw = recipe({"config": TINY_LLAMA}, {"micro_batch_size": 4}, compile=True)
    with one_rank(raw, CUDA) as job:
        reference = PlainLoop(job.hf_config, CUDA)
        rows = compare_step_by_step(job, reference, token_batches(STEPS, TINY_LLAMA["vocab_size"]))
    _report("compile", rows)
    for step, r in enumerate(rows, 1):
        assert r["loss_rel"] < 1e-5 and r["grad_norm_rel"] < 1e-4, (step, r)
        assert r["param_abs"] < 2e-5, (step, r)  # lr 1e-3: 2% of one update


def test_fp8_with_fsdp2_float8_all_gather_matches_torchao_step_by_step():
    raw = recipe({"config": TINY_LLAMA}, {"micro_batch_size": 8}, fp8="tensorwise")
    with one_rank(raw, CUDA) as job:
        assert job.engine.built.fp8_all_gather  # FSDP2 all-gathers the weights in FP8, scales precomputed per step
        kinds = {type(p._local_tensor).__name__ for n, p in job.engine.built.parts[0].named_parameters() if "proj" in n}
        assert kinds == {"WeightWithDynamicFloat8CastTensor"}, kinds
        reference = PlainLoop(job.hf_config, CUDA, prepare=torchao_float8("tensorwise", emulate=False))
        rows = compare_step_by_step(job, reference, token_batches(STEPS, TINY_LLAMA["vocab_size"]))
    _report("fp8 tensorwise + float8 all-gather", rows)
    for step, r in enumerate(rows, 1):
        assert r["loss_rel"] < 1e-4 and r["grad_norm_rel"] < 1e-3, (step, r)
        assert r["param_abs"] < 2e-5, (step, r)


def _offload_run(offload: bool) -> tuple[list[tuple[float, float]], dict]:
    seen = {"pinned": [], "streams": 0, "copied": 0}
    raw = recipe({"config": TINY_LLAMA}, {"micro_batch_size": 4, "offload_activations": offload})
    with one_rank(raw, CUDA) as job:
        offloaders = {
            id(m.offloader): m.offloader for m in job.engine.built.parts[0].modules() if hasattr(m, "offloader")
        }
        for offloader in offloaders.values():
            copy_out = offloader._copy_out

            def spy(tensor, copy_out=copy_out):  # records what the real copy returns; changes nothing
                host = copy_out(tensor)
                seen["pinned"].append(host.is_pinned())
                return host

            offloader._copy_out = spy
        out = [job.step(batch) for batch in token_batches(5, TINY_LLAMA["vocab_size"])]
        seen["streams"] = sum(len(o._streams) for o in offloaders.values())
        seen["copied"] = sum(o.copied_bytes for o in offloaders.values())
    return out, seen


def test_activation_offload_uses_pinned_buffers_and_a_side_stream_and_changes_nothing():
    plain, _ = _offload_run(False)
    offloaded, seen = _offload_run(True)
    assert seen["copied"] > 0 and seen["pinned"] and all(seen["pinned"]), seen["pinned"][:5]
    assert seen["streams"] == 1  # one CUDA side stream for the copies
    for step, ((loss, norm), (ref_loss, ref_norm)) in enumerate(zip(offloaded, plain, strict=True), 1):
        assert loss == pytest.approx(ref_loss, rel=1e-6) and norm == pytest.approx(ref_norm, rel=1e-6), step


def test_qlora_nf4_base_on_cuda_is_torchao_s_quantisation_and_trains_as_on_the_cpu(tmp_path):
    from safetensors.torch import load_file
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor, to_nf4

    folder = save_tiny_model(tmp_path / "base", spec=TINY_LLAMA)
    saved = load_file(str(folder / "model.safetensors"))
    raw = recipe(
        {"name_or_path": str(folder)}, {"backend": "ddp", "micro_batch_size": 4}, method="qlora", mixed_precision="bf16"
    )
    batches = token_batches(1, TINY_LLAMA["vocab_size"]) * 3  # one batch three times: the loss on it must fall
    losses = {}
    for device in (CUDA, torch.device("cpu")):
        with one_rank(raw, device) as job:
            if device.type == "cuda":
                checked = 0
                for name, param in job.engine.built.parts[0].named_parameters():
                    local = getattr(param, "_local_tensor", param)
                    if not isinstance(local, NF4Tensor):
                        continue
                    assert local.quantized_data.device.type == "cuda", name
                    hf = job.engine.built.hf_name(name)
                    ours = to_nf4(saved[hf].to(CUDA, torch.bfloat16), local.block_size, local.scaler_block_size)
                    torch.testing.assert_close(local.get_original_weight(), ours.get_original_weight(), rtol=0, atol=0)
                    checked += 1
                assert checked == 2 * 7  # q, k, v, o, gate, up, down of both blocks
            losses[device.type] = [job.step(batch) for batch in batches]
    print(f"qlora losses cuda {losses['cuda']} cpu {losses['cpu']}")
    for (cuda_loss, cuda_norm), (cpu_loss, cpu_norm) in zip(losses["cuda"], losses["cpu"], strict=True):
        assert cuda_loss == pytest.approx(cpu_loss, rel=2e-2) and cuda_norm == pytest.approx(cpu_norm, rel=5e-2)
    assert losses["cuda"][-1][0] < losses["cuda"][0][0]  # it trains


def test_plan_auto_detects_this_gpu():
    import bigtrain

    result = bigtrain.plan("qwen2.5-0.5b", seq_len=2048, global_batch_size=16)
    name = torch.cuda.get_device_name(0)
    free, total = torch.cuda.mem_get_info(0)
    print(f"detected {result.cluster.gpu.name} x {result.cluster.num_gpus}, {result.cluster.gpu.memory_bytes} bytes")
    assert result.cluster.num_gpus == torch.cuda.device_count()
    assert result.cluster.gpu.name.split()[-1] in name or result.cluster.gpu.name in name, (result.cluster.gpu, name)
    assert 0.5 * free <= result.cluster.gpu.memory_bytes <= total
    assert result.fits


@pytest.mark.parametrize("case", ["1b-z3-N8", "1b-z2-N8-accum2"])
def test_rank0_of_an_8_gpu_fsdp2_job_is_within_5_percent_of_the_planner(case):
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "rank0_on_device.py"), "--one", case],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1][len("RESULT ") :])
    sys.path.insert(0, str(REPO / "bench"))
    import rank0_on_device

    predicted = rank0_on_device.predict({c.name: c for c in rank0_on_device.CASES}[case], result["plan"])[
        "predicted_bytes"
    ]
    measured = result["peak_allocated_bytes"]
    print(f"{case}: predicted {predicted / 2**30:.2f} GiB, measured {measured / 2**30:.2f} GiB on {result['device']}")
    assert abs(predicted / measured - 1) < 0.05


def test_the_single_rank_harness_has_teeth_on_cuda():
    """A reference whose learning rate is 10% off is caught by the step-by-step comparison's tolerances."""
    raw = recipe({"config": TINY_LLAMA}, {"micro_batch_size": 8})
    with one_rank(raw, CUDA) as job:
        reference = PlainLoop(job.hf_config, CUDA)
        for group in reference.opt.param_groups:
            group["lr"] *= 1.1
        rows = compare_step_by_step(job, reference, token_batches(3, TINY_LLAMA["vocab_size"]))
    assert max(r["param_abs"] for r in rows) > 2e-5 * 2
