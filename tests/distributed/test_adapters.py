"""LoRA trains the same adapters as a plain single-process peft loop, on every engine, and saves them whole.

The reference is what a peft user writes: ``get_peft_model`` on the HF model, AdamW over the adapter parameters
only, the whole global batch in one forward with HF's mean loss, ``clip_grad_norm_`` over the adapters. Its
adapters start from bigtrain's documented initial values (peft's Kaiming-uniform ``lora_A`` drawn per adapter from
``train.seed`` and the adapter's name, ``lora_B`` zero). Compared per step: loss and gradient norm; after the last
step: every adapter parameter. Data, schedule and order are the equivalence test's (``test_equivalence.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cases import TINY_LLAMA
from helpers import quantize_adapted_bases, read_metrics, run_torchrun, save_tiny_model, with_sections, write_recipe
from shared_launch import WORKER, SharedLaunches, launch_key, selected
from test_equivalence import (
    BETAS,
    CLIP,
    EPS,
    GLOBAL_BATCH,
    LR,
    PARAM_ATOL,
    RTOL,
    SEED,
    STEPS,
    WD,
    global_batch_rows,
    lr_lambda,
    recipe_for,
)
from test_equivalence import data as equivalence_data

from bigtrain.parallel.transforms.adapters import initial_lora_A

R, ALPHA = 4, 8.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peft_reference(
    model_dir,
    rows,
    alpha=ALPHA,
    leak_base=False,
    qlora=False,
    micro=GLOBAL_BATCH,
    bf16=None,
    nf4_shards=1,
    modules_to_save=None,
    keep_model=False,
):
    """(metrics per step, adapters after the last step under their peft file names without the prefix), and the
    trained peft model when ``keep_model``.

    ``modules_to_save``: peft's modules trained fully (with ensure_weight_tying: TINY_LLAMA ties its LM head to the
    embedding, and the trained copy then serves both), keyed by the module's own name.

    ``nf4_shards``: QLoRA's NF4 base as the plan quantises it (at these tiny widths the second-level scale block
    shrinks so that FSDP2's shards split it: see ``nf4_scaler_block``).
    ``micro``: forward and backward over micro-batches of this many rows, each loss weighted by its share of the
    batch's tokens (every row has the same number), as the plan under test does. In fp32 the split changes nothing
    measurable; under QLoRA's bf16 every matmul output is rounded, so the split must be the same to compare at 1e-4.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    # a QLoRA user loads the base in bf16, then quantises its linears; the adapters stay fp32 (autocast computes)
    bf16 = qlora if bf16 is None else bf16
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if bf16 else torch.float32)
    config = LoraConfig(
        r=R,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=TARGETS,
        modules_to_save=modules_to_save,
        ensure_weight_tying=modules_to_save is not None,
    )
    model = get_peft_model(model, config)
    if bf16:
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.data = param.data.float()
    adapters = {}
    for name, param in model.named_parameters():
        key = name.removeprefix("base_model.model.").replace(".modules_to_save.", ".").replace(".default.", ".")
        if ".lora_A." in key:
            param.data.copy_(initial_lora_A(key, tuple(param.shape), SEED))
        if param.requires_grad:
            adapters[key] = param
        if leak_base and "base_layer" in name:
            param.requires_grad_(True)  # the mistake a frozen-base check must catch
    if qlora:  # the NF4 base made with torchao's own API, not bigtrain's
        quantize_adapted_bases(model, nf4_shards)
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    out = []
    for step in range(STEPS):
        batch = torch.from_numpy(rows[global_batch_rows(step)])
        loss = 0.0
        for part in batch.split(micro):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                part_loss = model(input_ids=part, labels=part).loss * (len(part) / len(batch))
            part_loss.backward()
            loss += part_loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(trained, CLIP)
        opt.step()
        schedule.step()
        opt.zero_grad()
        out.append({"loss": loss.item(), "grad_norm": norm.item()})
    trained = {k: v.detach().clone() for k, v in adapters.items()}
    return (out, trained, model.eval()) if keep_model else (out, trained)


# the equivalence test's corpus (its fixture, one per module): (folder holding rows.npy, the rows)
data = equivalence_data


@pytest.fixture(scope="module")
def lora_inputs(data):
    root, rows = data
    model_dir = save_tiny_model(root / "lora-base", spec=TINY_LLAMA)
    return model_dir, *peft_reference(model_dir, rows)


def lora_recipe(model_dir, rows_path, parallel, out, method="lora", **lora):
    base = recipe_for(model_dir, rows_path, parallel, out)
    precision = "bf16" if method == "qlora" else "fp32"
    train = {**base["train"], "method": method, "mixed_precision": precision}
    checkpoint = {"save_final_model": True}  # output_dir/adapter: checked by assert_adapter_folder_is_whole
    return with_sections(base, train=train, lora={"r": R, "alpha": ALPHA, **lora}, checkpoint=checkpoint)


def peft_model_with(model_dir, adapters):
    """The HF base with peft's adapters holding ``adapters`` (the trained model as a peft user has it)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS))
    state = {"base_model.model." + k.replace(".weight", ".default.weight"): v for k, v in adapters.items()}
    missing = set(state) - set(model.state_dict())
    assert not missing, sorted(missing)[:3]
    model.load_state_dict(state, strict=False)
    return model.eval()


def assert_adapter_folder_is_whole(model_dir, out, reference_params, cli):
    """output_dir/adapter loads with PeftModel.from_pretrained and gives the reference loop's trained logits; the
    merged export gives the same logits as a plain HF model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.arange(24).reshape(2, 12) % TINY_LLAMA["vocab_size"]
    with torch.no_grad():
        expected = peft_model_with(model_dir, reference_params)(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        loaded = PeftModel.from_pretrained(base, out / "adapter").eval()
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=0, atol=1e-5)
        proc = cli(["export-model", str(out), "--merge", "-o", str(out / "merged")])
        assert proc.returncode == 0, proc.stderr[-2000:]
        merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=0, atol=1e-5)


ADAPTER_PLANS = {
    "1rank-accum2": (1, dict(backend="fsdp2", micro_batch_size=4)),
    "ddp-2ranks-accum2": (2, dict(backend="ddp", micro_batch_size=2)),
    "fsdp2-2ranks-accum2": (2, dict(backend="fsdp2", micro_batch_size=2)),
    "hsdp-2x2-accum2": (4, dict(backend="fsdp2", dp_replicate=2, dp_shard=2, micro_batch_size=1)),
    "1rank-compile-accum2": (1, dict(backend="fsdp2", micro_batch_size=4)),
    # on DeepSpeed, with the capabilities no other case pairs with LoRA there: every other block checkpointed and what
    # the blocks save in host memory, the chunked loss (on ZeRO-2: on ZeRO-3 a row refuses it with adapters,
    # tests/pairs.py found it failing); selective checkpointing
    "deepspeed-zero2-ac-every2-offload-chunked-loss-accum2": (
        2,
        dict(
            backend="deepspeed",
            zero_stage=2,
            micro_batch_size=2,
            activation_checkpointing="full",
            checkpoint_every=2,
            offload_activations=True,
            loss_chunk_tokens=7,
        ),
    ),
    "deepspeed-zero3-ac-selective-accum2": (
        2,
        dict(backend="deepspeed", zero_stage=3, micro_batch_size=2, activation_checkpointing="selective"),
    ),
    "fsdp2-zero2-ac-full-accum4": (
        2,
        dict(backend="fsdp2", zero_stage=2, micro_batch_size=1, activation_checkpointing="full"),
    ),
    # ZeRO-3 with the frozen base and the adapters' optimizer states offloaded to host memory
    "deepspeed-zero3-offload-accum2": (
        2,
        dict(backend="deepspeed", zero_stage=3, micro_batch_size=2, offload_optimizer=True, offload_params=True),
    ),
}


@pytest.fixture(scope="module")
def shared_runs(data, tmp_path_factory, request):
    """``run(model_dir, plans, name, method)``: (metrics, parameters, output_dir) of one case of ``plans``. The
    selected cases of one world size and engine family train in one launch (shared_launch.py); compile (its caches)
    runs alone."""
    root, _ = data
    shared = SharedLaunches(tmp_path_factory, "adapters")

    def recipe(model_dir, parallel: dict, method: str, compile_blocks: bool):
        def make(out: Path) -> dict:
            raw = lora_recipe(model_dir, root / "rows.npy", parallel, out, method)
            return with_sections(raw, train={**raw["train"], "compile": compile_blocks})

        return make

    def run(model_dir, plans: dict, name: str, method: str = "lora"):
        chosen = {*selected(request.session, f"test_{method}_matches_", "name"), name}
        cases = {
            (method, n): (
                launch_key(*plans[n], alone="compile" if "compile" in n else ""),
                recipe(model_dir, plans[n][1], method, "compile" in n),
            )
            for n in plans
            if n in chosen
        }
        launched = shared.get((method, name), cases)
        launched.check_finished()
        return read_metrics(launched.output_dir), torch.load(launched.params), launched.output_dir

    return run


def run_plan(model_dir, root, tmp_path, nproc, parallel, method="lora", compile_blocks=False, **lora):
    raw = lora_recipe(model_dir, root / "rows.npy", parallel, tmp_path / "out", method, **lora)
    raw = with_sections(raw, train={**raw["train"], "compile": compile_blocks})
    recipe = write_recipe(tmp_path / "recipe.yaml", raw)
    proc = run_torchrun([str(WORKER), str(recipe), str(tmp_path / "params.pt")], nproc=nproc, module=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_metrics(tmp_path / "out"), torch.load(tmp_path / "params.pt")


def assert_same(got, params, reference, reference_params, rtol=RTOL, atol=PARAM_ATOL, tied=()):
    """``tied``: names the worker reports beside the reference's (a tied LM head, the embedding's one weight)."""
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for step, (mine, ref) in enumerate(zip(got, reference, strict=True), 1):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=rtol), f"step {step} loss"
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=rtol), f"step {step} grad_norm"
    trained = set(params) - {"model.rotary_emb.inv_freq", *tied}
    assert trained == set(reference_params)  # nothing else is trained, nothing else is state
    for key, ref in reference_params.items():
        torch.testing.assert_close(params[key], ref, rtol=0, atol=atol, msg=lambda m, k=key: f"{k}: {m}")


# Found while forcing the AVX2 path (ATEN_CPU_CAPABILITY=avx2, as on a CPU without AVX-512): LoRA with train.compile
# gives a NaN loss at step 1 there (the trainer stops with its divergence line), while it equals the peft loop with
# AVX-512 kernels and full fine-tuning compiles fine on both. Not solved yet: the case runs where it is known to hold.
AVX2_COMPILE_NAN = (
    "LoRA + train.compile gives NaN at step 1 with ATen's AVX2 CPU kernels (open, see docs/fine-tuning.md)"
)


# the full tier (or the extended one: tests/tiers.py) adds hybrid sharding, compile, ZeRO-2, checkpointed FSDP2 ZeRO-2
# and ZeRO-3 with offload
ADAPTER_FULL_ONLY = (
    "hsdp-2x2-accum2",
    "1rank-compile-accum2",
    "deepspeed-zero2-ac-every2-offload-chunked-loss-accum2",
    "fsdp2-zero2-ac-full-accum4",
    "deepspeed-zero3-offload-accum2",
)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.full) if n in ADAPTER_FULL_ONLY else n for n in ADAPTER_PLANS]
)
def test_lora_matches_a_peft_loop_and_saves_the_whole_adapter(name, lora_inputs, shared_runs, cli_in_process):
    if "compile" in name and torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip(AVX2_COMPILE_NAN)
    model_dir, reference, reference_params = lora_inputs
    got, params, out = shared_runs(model_dir, ADAPTER_PLANS, name)
    assert_same(got, params, reference, reference_params)
    assert_adapter_folder_is_whole(model_dir, out, reference_params, cli_in_process)


def test_the_lora_comparison_catches_a_wrong_scaling_or_a_trained_base(data, lora_inputs):
    _, rows = data
    model_dir, reference, params = lora_inputs
    assert reference[-1]["loss"] < 0.98 * reference[0]["loss"]  # the adapters learn (4.86 -> 4.74 measured)
    for variant in (dict(alpha=R), dict(leak_base=True)):
        metrics, changed = peft_reference(model_dir, rows, **variant)
        loss_gap = max(abs(a["loss"] / b["loss"] - 1) for a, b in zip(metrics, reference, strict=True))
        norm_gap = max(abs(a["grad_norm"] / b["grad_norm"] - 1) for a, b in zip(metrics, reference, strict=True))
        param_gap = max(float((changed[k] - params[k]).abs().max()) for k in params)
        # measured: alpha = r (scaling 1 instead of 2) loss 1.0e-2, grad norm 0.56, adapters 3.5e-2; a trained base
        # loss 5.9e-2, grad norm 5.8, adapters 7.9e-2
        assert loss_gap > 10 * RTOL and norm_gap > 10 * RTOL, (variant, loss_gap, norm_gap)
        assert param_gap > 10 * PARAM_ATOL, (variant, param_gap)


@pytest.mark.full
def test_modules_to_save_train_fully_beside_the_adapters_and_load_with_peft(data, tmp_path, cli_in_process):
    """lora.modules_to_save=[embed_tokens] on a tied model, FSDP2 x 2 with accumulation: the embedding (and through
    it the tied LM head) trains as peft's modules_to_save with ensure_weight_tying trains it; the adapter folder
    carries it whole, PeftModel.from_pretrained and the merged export give the trained model's logits. (DeepSpeed
    ZeRO-3 and DDP gave the same within these tolerances when run by hand; the suite keeps one engine for time.)"""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root, rows = data
    model_dir = save_tiny_model(root / "lora-base", spec=TINY_LLAMA)
    saved = ["embed_tokens"]
    reference, reference_params, trained = peft_reference(model_dir, rows, modules_to_save=saved, keep_model=True)
    assert "model.embed_tokens.weight" in reference_params
    parallel = dict(backend="fsdp2", micro_batch_size=2)
    got, params = run_plan(model_dir, root, tmp_path, 2, parallel, modules_to_save=saved)
    assert_same(got, params, reference, reference_params, tied=("lm_head.weight",))
    torch.testing.assert_close(params["lm_head.weight"], params["model.embed_tokens.weight"], rtol=0, atol=0)

    ids = torch.arange(24).reshape(2, 12) % TINY_LLAMA["vocab_size"]
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        loaded = PeftModel.from_pretrained(base, tmp_path / "out" / "adapter").eval()
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=0, atol=1e-5)
        proc = cli_in_process(["export-model", str(tmp_path / "out"), "--merge", "-o", str(tmp_path / "merged")])
        assert proc.returncode == 0, proc.stderr[-2000:]
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=0, atol=1e-5)


QLORA_MICRO = 2
QLORA_PLANS = {
    "1rank-accum4": (1, dict(backend="ddp", micro_batch_size=QLORA_MICRO)),
    "ddp-2ranks-accum2": (2, dict(backend="ddp", micro_batch_size=QLORA_MICRO)),
    "fsdp2-2ranks-accum2": (2, dict(backend="fsdp2", micro_batch_size=QLORA_MICRO)),
}
QLORA_RTOL, QLORA_ATOL = 1e-4, 1e-4  # bf16 compute: the sums of another batch split round differently


@pytest.fixture(scope="module")
def qlora_inputs(data):
    """(base folder, reference metrics, reference adapters) for an NF4 base quantised for ``shards`` FSDP2 shards."""
    root, rows = data
    model_dir = save_tiny_model(root / "qlora-base", spec=TINY_LLAMA)
    cache = {}

    def get(shards):
        if shards not in cache:
            cache[shards] = peft_reference(model_dir, rows, qlora=True, micro=QLORA_MICRO, nf4_shards=shards)
        return (model_dir, *cache[shards])

    return get


# the full tier (or the extended one: tests/tiers.py) adds the 2-rank launch (DDP and FSDP2 over the same NF4 base)
@pytest.mark.parametrize(
    "name", [n if n == "1rank-accum4" else pytest.param(n, marks=pytest.mark.full) for n in QLORA_PLANS]
)
def test_qlora_matches_a_peft_loop_over_the_same_nf4_base(name, qlora_inputs, shared_runs):
    nproc, parallel = QLORA_PLANS[name]
    model_dir, reference, reference_params = qlora_inputs(nproc if parallel["backend"] == "fsdp2" else 1)
    got, params, _ = shared_runs(model_dir, QLORA_PLANS, name, method="qlora")
    assert_same(got, params, reference, reference_params, rtol=QLORA_RTOL, atol=QLORA_ATOL)


def test_the_qlora_comparison_catches_a_base_left_unquantised(data, qlora_inputs):
    _, rows = data
    model_dir, reference, params = qlora_inputs(1)
    metrics, changed = peft_reference(model_dir, rows, qlora=False, bf16=True, micro=QLORA_MICRO)
    loss_gap = max(abs(a["loss"] / b["loss"] - 1) for a, b in zip(metrics, reference, strict=True))
    param_gap = max(float((changed[k] - params[k]).abs().max()) for k in params)
    # measured: loss 7.3e-4 (7x the tolerance), adapters 5.7e-2 (570x)
    assert loss_gap > 5 * QLORA_RTOL and param_gap > 100 * QLORA_ATOL, (loss_gap, param_gap)


@pytest.mark.full
def test_an_adapter_checkpoint_holds_the_adapters_resumes_on_another_plan_and_refuses_a_changed_base(data, tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    root, _ = data
    model_dir = save_tiny_model(tmp_path / "base", spec=TINY_LLAMA)
    parallel = dict(backend="fsdp2", micro_batch_size=2)

    def recipe(out, steps, parallel=parallel):
        raw = lora_recipe(model_dir, root / "rows.npy", parallel, out)
        train = {**raw["train"], "steps": steps, "lr_schedule": "constant", "warmup_steps": 0}
        return write_recipe(out.with_suffix(".yaml"), with_sections(raw, train=train, checkpoint={"every": 5}))

    straight = tmp_path / "straight"
    assert run_torchrun(["train", str(recipe(straight, STEPS))]).returncode == 0
    resumed = tmp_path / "resumed"
    assert run_torchrun(["train", str(recipe(resumed, 5))]).returncode == 0
    step_5 = resumed / "checkpoints" / "step_5"
    saved = FileSystemReader(str(step_5)).read_metadata().state_dict_metadata
    tensors = {k: v for k, v in saved.items() if k.startswith(("model.", "optimizer.state.")) and hasattr(v, "size")}
    assert tensors and all(".lora_" in k or k.endswith("inv_freq") for k in tensors)  # no base, no base state
    tensor_bytes = sum(v.size.numel() * v.properties.dtype.itemsize for v in tensors.values())
    assert tensor_bytes < 0.5 * (model_dir / "model.safetensors").stat().st_size  # adapters + AdamW: 98 KiB here

    # resumed on another plan (DDP): the adapters and their AdamW state reshard as a full model's do
    proc = run_torchrun(["train", str(recipe(resumed, STEPS, dict(backend="ddp", micro_batch_size=2)))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from" in proc.stderr
    for mine, ref in zip(read_metrics(resumed), read_metrics(straight), strict=True):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=RTOL), mine["step"]
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=RTOL), mine["step"]

    save_tiny_model(model_dir, seed=1, spec=TINY_LLAMA)  # the base's files change under the run
    proc = run_torchrun(["train", str(recipe(resumed, 2 * STEPS))])
    assert proc.returncode != 0  # each rank exits 2 before the process group; torchrun reports 1
    lines = [line for line in proc.stderr.splitlines() if "not the one the adapters were trained on" in line]
    assert len(lines) == 2, proc.stderr[-3000:]  # one line on each rank


def test_method_auto_is_chosen_at_start_up_and_recorded(data, tmp_path):
    """train.method: auto with plan: auto on this CPU: the planner's choice is logged, trained and recorded in the
    checkpoint's recipe, so a resume keeps it (for a tiny model in host memory: full fine-tuning)."""
    root, _ = data
    model_dir = save_tiny_model(tmp_path / "base", spec=TINY_LLAMA)
    raw = lora_recipe(model_dir, root / "rows.npy", {"plan": "auto"}, tmp_path / "out", method="auto")
    raw = with_sections(raw, train={**raw["train"], "steps": 2}, checkpoint={"save_final_model": False})
    proc = run_torchrun(["train", str(write_recipe(tmp_path / "auto.yaml", raw))], nproc=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "auto chose train.method=full and the plan:" in proc.stderr
    saved = (tmp_path / "out" / "checkpoints" / "step_2" / "recipe.yaml").read_text()
    assert "method: full" in saved
