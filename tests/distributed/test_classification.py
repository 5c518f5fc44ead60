"""Image and sequence classifiers train the same model on every data-parallel plan as a plain single-process loop.

Each plan runs as a real job (torchrun, gloo) of ``TrainingJob`` and saves its trained parameters and buffers. The
reference is a torchvision-style loop written here: AdamW, ``clip_grad_norm_``, the warmup + cosine schedule and the
data order of ``test_equivalence.py``, the mean cross-entropy over the whole global batch, BatchNorm in train mode.
What BatchNorm sees depends on the split, so the loop splits as the plan does, and only there:
- ``sync_batchnorm: false``: each data-parallel rank's micro-batch is normalised on its own (one forward per
  micro-batch of each rank's slice, running statistics updated from it), and after the step the running statistics
  are the mean of the ranks' (``parallel/batch_norm.py``);
- ``sync_batchnorm: true``: micro-step j normalises the j-th micro-batches of all ranks together (one forward over
  their concatenation).
Compared: every step's loss and gradient norm (rel 1e-5), every parameter (2e-5) and the running statistics (1e-6
+ 5e-6 relative).
LoRA cases (ViT on FSDP2, BERT on DDP) against peft's ``get_peft_model`` loop: adapters on the blocks' linears, the
classifier in ``modules_to_save`` (a reference that leaves the head frozen misses step 1's grad norm by 4x).
``test_statistics_from_the_wrong_split_would_be_caught`` shows that the loop of the other BatchNorm mode lands far
outside these tolerances.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import read_metrics, recipe_dict, shuffled_global_batch, with_sections
from shared_launch import SharedLaunches, launch_key, selected

STEPS, GLOBAL_BATCH, SEED = 10, 16, 5
LR, WD, CLIP, WARMUP, MIN_LR_RATIO = 1e-2, 0.1, 1.0, 3, 0.1
BETAS, EPS = (0.9, 0.95), 1e-6
RTOL, PARAM_ATOL, STATS_ATOL, STATS_RTOL = 1e-5, 2e-5, 1e-6, 5e-6
IMAGE_SIZE = 32
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, which bigtrain uses without a processor
TEXT_LEN, TEXTS = 48, 64
LORA_R, LORA_ALPHA = 4, 8.0  # LoRA on the blocks' linears, the head trained fully (peft's modules_to_save)

RESNET = dict(
    model_type="resnet", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=10
)
BERT = dict(
    model_type="bert", vocab_size=260, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    classifier_dropout=0.0, num_labels=4,
)  # fmt: skip
VIT = dict(
    model_type="vit", image_size=IMAGE_SIZE, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=10,
)  # fmt: skip
MODELS = {"resnet": RESNET, "bert": BERT, "vit": VIT}


def lr_lambda(step: int) -> float:
    if step < WARMUP:
        return (step + 1) / WARMUP
    progress = (step - WARMUP) / (STEPS - WARMUP - 1)
    return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))


def global_batch(step: int, num_rows: int) -> np.ndarray:
    return shuffled_global_batch(step, num_rows, GLOBAL_BATCH, SEED)


def image_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """The built-in shapes as the model sees them without augmentation: [0, 1], normalised by ImageNet's statistics."""
    from bigtrain.data.synthetic_images import shapes

    images, labels = shapes()
    # contiguous NCHW, as bigtrain's loader stacks them: the permuted NHWC array would be channels-last, and every
    # convolution and BatchNorm of the loop would run channels-last (BatchNorm's CPU statistics are then one
    # sequential fp32 sum per thread, whose rounding depends on the thread count: OMP_NUM_THREADS=1 took the
    # reference 1.2e-6 off the product's running mean, docs/testing.md)
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().float() / 255.0
    pixels = (pixels - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    return pixels, torch.from_numpy(labels)


def text_records() -> list[dict]:
    """Short texts whose label is which of four words they repeat (learnable from the bytes)."""
    rng = np.random.default_rng(0)
    words = ["apple", "river", "stone", "cloud"]
    records = []
    for i in range(TEXTS):
        label = i % 4
        filler = " ".join(rng.choice(["a", "the", "on", "in", "by"], size=rng.integers(3, 8)))
        records.append({"text": f"{filler} {words[label]} {filler} {words[label]}", "label": label})
    return records


def text_inputs(records: list[dict]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Byte ids (bigtrain's byte tokenizer: one id per UTF-8 byte), cut at TEXT_LEN."""
    ids = [torch.tensor(list(r["text"].encode())[:TEXT_LEN]) for r in records]
    return ids, torch.tensor([r["label"] for r in records])


def forward_sum(model, arch: str, inputs, labels: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    """Summed cross-entropy of examples ``index`` in one forward (texts padded to the longest with a mask)."""
    if arch == "bert":
        rows = [inputs[i] for i in index]
        longest = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), longest, dtype=torch.long)
        mask = torch.zeros(len(rows), longest, dtype=torch.long)
        for k, r in enumerate(rows):
            ids[k, : len(r)], mask[k, : len(r)] = r, 1
        logits = model(input_ids=ids, attention_mask=mask).logits
    else:
        logits = model(pixel_values=inputs[index]).logits
    return torch.nn.functional.cross_entropy(logits, labels[index], reduction="sum")


def batch_norms(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def reference_run(
    model_dir, arch: str, inputs, labels, ranks: int, micro: int, sync: bool, betas=BETAS, lora: bool = False
):
    """The plain loop over ``ranks`` x (accumulation) x ``micro`` examples per step, BatchNorm split as described in
    the module docstring; returns each step's loss and grad norm, and the final state dict (under LoRA: the adapters
    and the head, as peft trains them, under the model's names)."""
    from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if arch == "bert" else AutoModelForImageClassification
    model = auto.from_pretrained(model_dir, dtype=torch.float32)
    if lora:
        model = with_adapters(model)
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=LR, betas=betas, eps=EPS, weight_decay=WD)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    per_rank = GLOBAL_BATCH // ranks
    accum = per_rank // micro
    out = []
    for step in range(STEPS):
        index = global_batch(step, len(labels))
        loss_sum = 0.0
        if sync:  # micro-step j: the j-th micro-batch of every rank, normalised together
            for j in range(accum):
                part = np.concatenate([index[r * per_rank + j * micro :][:micro] for r in range(ranks)])
                loss = forward_sum(model, arch, inputs, labels, part)
                (loss / GLOBAL_BATCH).backward()
                loss_sum += loss.item()
        else:  # each rank's micro-batches on their own, from the step's running statistics; then their mean
            start = [{k: v.clone() for k, v in bn.state_dict().items()} for bn in batch_norms(model)]
            ends = []
            for r in range(ranks):
                for bn, state in zip(batch_norms(model), start, strict=True):
                    bn.load_state_dict(state)
                for j in range(accum):
                    loss = forward_sum(model, arch, inputs, labels, index[r * per_rank + j * micro :][:micro])
                    (loss / GLOBAL_BATCH).backward()
                    loss_sum += loss.item()
                ends.append([(bn.running_mean.clone(), bn.running_var.clone()) for bn in batch_norms(model)])
            for i, bn in enumerate(batch_norms(model)):
                bn.running_mean.copy_(torch.stack([e[i][0] for e in ends]).mean(0))
                bn.running_var.copy_(torch.stack([e[i][1] for e in ends]).mean(0))
        norm = torch.nn.utils.clip_grad_norm_(trained, CLIP)
        opt.step()
        schedule.step()
        opt.zero_grad()
        out.append({"loss": loss_sum / GLOBAL_BATCH, "grad_norm": norm.item()})
    if lora:
        return out, adapter_state(model)
    return out, {k: v.detach().clone() for k, v in model.state_dict().items()}


def with_adapters(model):
    """peft's LoRA on every linear of the encoder's layers, the classifier trained fully (peft's modules_to_save);
    each ``lora_A`` from bigtrain's documented initial values (seeded by train.seed and the adapter's name)."""
    from peft import LoraConfig, get_peft_model

    from bigtrain.parallel.transforms.adapters import initial_lora_A

    layer = next(m for m in model.modules() if type(m).__name__ in ("ViTLayer", "BertLayer"))  # the first block
    targets = sorted({n.rsplit(".", 1)[-1] for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)})
    config = LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, target_modules=targets, modules_to_save=["classifier"])
    model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_A." in name:
                own = name.removeprefix("base_model.model.").replace(".default", "")
                param.copy_(initial_lora_A(own, tuple(param.shape), SEED))
    return model


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The trained parameters of a peft model under the model's own names (what bigtrain's state dict holds)."""
    out = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            own = name.removeprefix("base_model.model.").replace(".modules_to_save.default", "")
            out[own.replace(".default", "")] = param.detach().clone()
    return out


EVERY = "every_micro_step"
# name: (ranks, micro-batch, parallel section); the reference splits as (ranks, micro, sync_batchnorm)
PLANS = {
    "1rank-accum2": (1, 8, dict(backend="ddp", micro_batch_size=8)),
    "ddp-2ranks-accum2": (2, 4, dict(backend="ddp", micro_batch_size=4)),
    "ddp-2ranks-accum2-sync": (2, 4, dict(backend="ddp", micro_batch_size=4, sync_batchnorm=True)),
    "fsdp2-2ranks-accum2": (2, 4, dict(backend="fsdp2", micro_batch_size=4, grad_reduce=EVERY)),
    "fsdp2-2ranks-accum2-sync": (2, 4, dict(backend="fsdp2", micro_batch_size=4, sync_batchnorm=True)),
    "hsdp-2x2-accum2": (4, 2, dict(backend="fsdp2", dp_replicate=2, dp_shard=2, micro_batch_size=2)),
    "ddp-2ranks-accum2-channels_last": (2, 4, dict(backend="ddp", micro_batch_size=4, channels_last=True)),
    "fsdp2-2ranks-accum2-channels_last": (2, 4, dict(backend="fsdp2", micro_batch_size=4, channels_last=True)),
    "fsdp2-2ranks-accum2-ac": (2, 4, dict(backend="fsdp2", micro_batch_size=4, activation_checkpointing="full")),
    "ddp-2ranks-accum2-ac": (2, 4, dict(backend="ddp", micro_batch_size=4, activation_checkpointing="selective")),
    "fsdp2-2ranks-accum2-lora": (2, 4, dict(backend="fsdp2", micro_batch_size=4)),
    "fsdp2-2ranks-accum2-compile": (2, 4, dict(backend="fsdp2", micro_batch_size=4)),
    "ddp-2ranks-accum2-lora": (2, 4, dict(backend="ddp", micro_batch_size=4)),
    "deepspeed-zero2-accum2": (2, 4, dict(backend="deepspeed", zero_stage=2, micro_batch_size=4)),
    "deepspeed-zero3-accum2": (2, 4, dict(backend="deepspeed", zero_stage=3, micro_batch_size=4)),
}
# what a plan's name ending adds to the recipe beyond its parallel section
TRAIN_OPTIONS = {
    "lora": {"train": {"method": "lora"}, "lora": {"r": LORA_R, "alpha": LORA_ALPHA}},
    "compile": {"train": {"compile": True}},
}
CASES = [
    ("resnet", "1rank-accum2"),
    ("resnet", "ddp-2ranks-accum2"),
    ("resnet", "ddp-2ranks-accum2-sync"),
    ("resnet", "fsdp2-2ranks-accum2"),
    ("resnet", "fsdp2-2ranks-accum2-sync"),
    ("resnet", "hsdp-2x2-accum2"),
    ("resnet", "ddp-2ranks-accum2-channels_last"),
    ("resnet", "fsdp2-2ranks-accum2-channels_last"),
    ("resnet", "deepspeed-zero2-accum2"),
    ("resnet", "deepspeed-zero3-accum2"),
    ("vit", "fsdp2-2ranks-accum2"),
    ("vit", "fsdp2-2ranks-accum2-ac"),
    ("bert", "fsdp2-2ranks-accum2"),
    ("bert", "ddp-2ranks-accum2"),
    ("bert", "ddp-2ranks-accum2-ac"),
    ("vit", "fsdp2-2ranks-accum2-lora"),
    ("vit", "fsdp2-2ranks-accum2-compile"),
    ("bert", "ddp-2ranks-accum2-lora"),
]
FULL_ONLY = {
    ("resnet", "1rank-accum2"),
    ("resnet", "fsdp2-2ranks-accum2-channels_last"),
    ("resnet", "hsdp-2x2-accum2"),
    ("resnet", "deepspeed-zero3-accum2"),
    ("vit", "fsdp2-2ranks-accum2"),
    ("vit", "fsdp2-2ranks-accum2-ac"),
    ("bert", "ddp-2ranks-accum2"),
    ("bert", "ddp-2ranks-accum2-lora"),
    ("bert", "ddp-2ranks-accum2-ac"),
    ("vit", "fsdp2-2ranks-accum2-compile"),  # inductor compiles the blocks on 2 cores: ~30 s
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("classify")
    records = text_records()
    (root / "texts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root, {"resnet": image_inputs(), "vit": image_inputs(), "bert": text_inputs(records)}


@pytest.fixture(scope="module")
def models(inputs):
    """A saved model folder per architecture (built from its config under a fixed seed), and its reference runs."""
    from transformers import AutoConfig, AutoModelForImageClassification, AutoModelForSequenceClassification

    root, data = inputs
    folders, runs = {}, {}

    def folder(arch: str):
        if arch not in folders:
            spec = dict(MODELS[arch])
            config = AutoConfig.for_model(spec.pop("model_type"), **spec)
            auto = AutoModelForSequenceClassification if arch == "bert" else AutoModelForImageClassification
            torch.manual_seed(0)
            auto.from_config(config).save_pretrained(root / arch)
            folders[arch] = root / arch
        return folders[arch]

    def reference(arch: str, name: str):
        ranks, micro, parallel = PLANS[name]
        key = (arch, ranks, micro, bool(parallel.get("sync_batchnorm")) and arch == "resnet", name.endswith("-lora"))
        if key not in runs:
            runs[key] = reference_run(folder(arch), arch, *data[arch], *key[1:4], lora=key[4])
        return runs[key]

    return folder, reference


def recipe_for(model_dir, arch: str, data_root, parallel: dict, output_dir) -> dict:
    text = arch == "bert"
    path = data_root / "texts.jsonl" if text else "builtin:shapes"
    data = {"shuffle": True}
    data.update(seq_len=TEXT_LEN) if text else data.update(image_size=IMAGE_SIZE, augment="none")
    return recipe_dict(
        output_dir,
        path,
        model_dir,
        data=data,
        train={
            "steps": STEPS,
            "global_batch_size": GLOBAL_BATCH,
            "lr": LR,
            "lr_schedule": "cosine",
            "warmup_steps": WARMUP,
            "min_lr_ratio": MIN_LR_RATIO,
            "weight_decay": WD,
            "adam_beta1": BETAS[0],
            "adam_beta2": BETAS[1],
            "adam_eps": EPS,
            "grad_clip": CLIP,
            "seed": SEED,
        },
        parallel=parallel,
        checkpoint={"save_final_model": False},
    )


@pytest.fixture(scope="module")
def launches(inputs, models, tmp_path_factory, request):
    root, _ = inputs
    folder, _ = models
    shared = SharedLaunches(tmp_path_factory, "classify")

    def recipe(arch: str, name: str):
        extra = TRAIN_OPTIONS.get(name.rsplit("-", 1)[-1], {})
        return lambda out: with_sections(recipe_for(folder(arch), arch, root, PLANS[name][2], out), **extra)

    chosen = selected(request.session, "test_classifier_matches_a_plain_loop", "arch", "name")
    cases = {(a, n): (launch_key(PLANS[n][0], PLANS[n][2]), recipe(a, n)) for a, n in chosen}
    return lambda arch, name: shared.get((arch, name), cases)


def assert_matches(output_dir, params_path, reference, reference_state) -> None:
    got = read_metrics(output_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for step, (mine, ref) in enumerate(zip(got, reference, strict=True), 1):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=RTOL), f"step {step} loss"
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=RTOL), f"step {step} grad_norm"
    state = torch.load(params_path)
    assert set(state) == set(reference_state)  # parameters and BatchNorm's buffers, under HF's names
    for key, ref in reference_state.items():
        # running statistics: also relative to their size (a variance near 1.5, averaged over the ranks, carries
        # float32 noise of up to 3e-6: measured 2.1e-6 relative at most)
        rtol, atol = (STATS_RTOL, STATS_ATOL) if "running" in key else (0, PARAM_ATOL)
        got = state[key].to(ref.dtype)
        torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, msg=lambda m, k=key: f"{k}: {m}")


TIERED = [pytest.param(a, n, marks=pytest.mark.full) if (a, n) in FULL_ONLY else (a, n) for a, n in CASES]


@pytest.mark.parametrize("arch, name", TIERED, ids=[f"{a}-{n}" for a, n in CASES])
def test_classifier_matches_a_plain_loop(arch, name, models, launches):
    _, reference = models
    ref, ref_state = reference(arch, name)
    launched = launches(arch, name)
    launched.check_finished()
    assert_matches(launched.output_dir, launched.params, ref, ref_state)


def test_the_reference_trains_and_clips(models):
    """Not vacuous: every parameter kind moves far beyond the tolerance, and clipping is active on several steps."""
    from transformers import AutoModelForImageClassification

    folder, reference = models
    ref, state = reference("resnet", "ddp-2ranks-accum2")
    start = AutoModelForImageClassification.from_pretrained(folder("resnet")).state_dict()
    moved = [(state[k] - start[k]).abs().max().item() for k in state if k.endswith((".weight", ".bias"))]
    assert min(moved) > 100 * PARAM_ATOL
    assert sum(r["grad_norm"] > CLIP for r in ref) >= 3


def test_statistics_from_the_wrong_split_would_be_caught(models):
    """The loop of the other BatchNorm mode (synchronised instead of per rank, and the whole step as one batch)
    differs from the per-rank loop by far more than the tolerances."""
    _, reference = models
    per_rank, per_rank_state = reference("resnet", "ddp-2ranks-accum2")
    synced, synced_state = reference("resnet", "ddp-2ranks-accum2-sync")
    whole, whole_state = reference("resnet", "1rank-accum2")
    for other, other_state in ((synced, synced_state), (whole, whole_state)):
        norm_gap = max(
            abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(other, per_rank, strict=True)
        )
        assert norm_gap > 10 * RTOL
        stats_gap = max(
            (other_state[k] - per_rank_state[k]).abs().max().item() for k in per_rank_state if "running" in k
        )
        assert stats_gap > 10 * STATS_ATOL


def test_batchnorm_keeps_fp32_under_fsdp2_s_bf16_parameter_cast(tmp_path):
    """Each BatchNorm is its own FSDP2 unit gathered in fp32 (its forward upcasts too), every other unit in bf16."""
    import torch.distributed as dist
    from helpers import free_port, recipe_engine
    from torch.distributed.fsdp import FSDPModule

    from bigtrain.config.load import build_dataclass
    from bigtrain.config.schema import RecipeConfig

    raw = recipe_for(None, "resnet", tmp_path, dict(backend="fsdp2", micro_batch_size=8), tmp_path / "out")
    raw["model"] = {"config": dict(RESNET)}
    raw["train"]["mixed_precision"] = "bf16"
    cfg = build_dataclass(RecipeConfig, raw, "")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        engine, _ = recipe_engine(cfg)
        model = engine.built.parts[0]
        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        norms = [m for m in units if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        assert len(norms) == len(batch_norms(model)) > 0
        assert all(m._get_fsdp_state()._mp_policy.param_dtype == torch.float32 for m in norms)
        others = [m for m in units if m not in norms]
        assert others and all(m._get_fsdp_state()._mp_policy.param_dtype == torch.bfloat16 for m in others)
        pixels = torch.randn(2, 3, IMAGE_SIZE, IMAGE_SIZE)
        assert torch.isfinite(model(pixel_values=pixels).logits).all()
    finally:
        dist.destroy_process_group()
