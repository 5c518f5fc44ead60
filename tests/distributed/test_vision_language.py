"""Vision-language models train the same model on every data-parallel plan as a plain single-process loop.

Tiny models of three families (Qwen2.5-VL, Idefics3, LLaVA: ``recipes/make_vlm_demo.py``) train on the built-in image
conversations (``builtin:image_chat``) as real jobs (torchrun, gloo). The reference is written here: the HF model
from ``from_pretrained``, each micro-batch through the family's processor (``AutoProcessor`` semantics: the chat
template, then ``processor(text, images, padding=max_length)``), labels found on the token ids (everything after
``<|im_start|>assistant\\n`` through its ``<|im_end|>\\n``), the summed cross-entropy divided by the global batch's
labelled tokens, ``clip_grad_norm_`` and AdamW over the parameters that train (peft's LoRA on the language model's
linears; a frozen vision tower's parameters never reach the optimizer). Compared: every step's loss and grad norm
(rel 1e-5), every trained parameter (2e-5), and the frozen ones bit for bit against the starting folder. QLoRA's
cases load the base in bf16, quantise the adapted linears with torchao's ``to_nf4`` and compute under autocast, and
compare at 1e-4, as the causal LMs' QLoRA cases do (bf16 rounds another split of the same sums differently).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import quantize_adapted_bases, read_metrics, recipe_dict, shuffled_global_batch, with_sections
from shared_launch import SharedLaunches, launch_key, selected

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
from make_vlm_demo import save_tiny_vlm  # noqa: E402

STEPS, GLOBAL_BATCH, SEED, LR, CLIP = 10, 4, 3, 1e-3, 1.0
RTOL, PARAM_ATOL = 1e-5, 2e-5
SEQ_LEN = {"qwen2_5_vl": 160, "idefics3": 256, "llava": 256}
LORA_R, LORA_ALPHA = 4, 8.0
VISION_TOWERS = ("visual", "vision_model", "vision_tower")

# name: (family, ranks, parallel section, train section extras, model.freeze)
CASES = {
    "qwen2_5_vl-fsdp2-accum2": ("qwen2_5_vl", 2, dict(backend="fsdp2", micro_batch_size=1), {}, []),
    "idefics3-fsdp2-accum2-lora": ("idefics3", 2, dict(backend="fsdp2", micro_batch_size=1), {"method": "lora"}, []),
    "llava-zero3-accum2-frozen-vision": (
        "llava",
        2,
        dict(backend="deepspeed", zero_stage=3, micro_batch_size=1),
        {},
        ["vision_tower"],
    ),
    "qwen2_5_vl-ddp-frozen-vision": ("qwen2_5_vl", 2, dict(backend="ddp", micro_batch_size=2), {}, ["vision_tower"]),
    "llava-fsdp2-accum2-lora": ("llava", 2, dict(backend="fsdp2", micro_batch_size=1), {"method": "lora"}, []),
    "qwen2_5_vl-fsdp2-accum2-ac": (
        "qwen2_5_vl",
        2,
        dict(backend="fsdp2", micro_batch_size=1, activation_checkpointing="full"),
        {},
        [],
    ),
    "idefics3-zero2-ac-selective": (
        "idefics3",
        2,
        dict(backend="deepspeed", zero_stage=2, micro_batch_size=2, activation_checkpointing="selective"),
        {},
        [],
    ),
    # bf16: found that FSDP2 cast the fp32 rotary embeddings Qwen-VL hands its vision blocks (parallel/transforms/fsdp.py)
    "qwen2_5_vl-fsdp2-accum2-qlora": (
        "qwen2_5_vl",
        2,
        dict(backend="fsdp2", micro_batch_size=1),
        {"method": "qlora", "mixed_precision": "bf16"},
        [],
    ),
    "qwen2_5_vl-fsdp2-tp2": ("qwen2_5_vl", 2, dict(backend="fsdp2", micro_batch_size=2, tp=2), {}, []),
    "llava-ddp-accum2-qlora": (
        "llava",
        2,
        dict(backend="ddp", micro_batch_size=1),
        {"method": "qlora", "mixed_precision": "bf16"},
        [],
    ),
}
# QLoRA computes in bf16: another split of the same sums rounds differently (as tests/distributed/test_adapters.py)
QLORA_RTOL = QLORA_ATOL = 1e-4
FULL_ONLY = {
    "qwen2_5_vl-ddp-frozen-vision",
    "llava-fsdp2-accum2-lora",
    "qwen2_5_vl-fsdp2-accum2-ac",
    "idefics3-zero2-ac-selective",
    "llava-ddp-accum2-qlora",
}


def global_batch(step: int, num_rows: int) -> np.ndarray:
    return shuffled_global_batch(step, num_rows, GLOBAL_BATCH, SEED)


def conversations() -> list[tuple[list[dict], list]]:
    """The built-in conversations as (messages with bare image items, PIL images)."""
    from PIL import Image

    from bigtrain.data.builtin_images import image_chat_records

    out = []
    for _, record in image_chat_records("image_chat", seed=SEED):
        images, messages = [], []
        for message in record["messages"]:
            content = []
            for item in message["content"]:
                if item["type"] == "image":
                    images.append(Image.fromarray(item["image"]))
                    content.append({"type": "image"})
                else:
                    content.append(item)
            messages.append({"role": message["role"], "content": content})
        out.append((messages, images))
    return out


def assistant_labels(ids: torch.Tensor, tokenizer) -> torch.Tensor:
    """Next-token labels on the assistant's tokens: after ``<|im_start|>assistant\\n``, through ``<|im_end|>\\n``."""
    opening = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    end, newline = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.encode("\n", add_special_tokens=False)[0]
    labels = torch.full_like(ids, -100)
    for r, row in enumerate(ids.tolist()):
        t = 0
        while t < len(row):
            if row[t : t + len(opening)] == opening:
                t += len(opening)
                while t < len(row) and row[t] != end:
                    labels[r, t - 1] = row[t]
                    t += 1
                labels[r, t - 1] = end
                if t + 1 < len(row) and row[t + 1] == newline:
                    labels[r, t] = newline
            t += 1
    return labels


def processor_of(folder):
    from bigtrain.data.processor import load_processor  # AutoProcessor, or without its video processor (torchvision)

    return load_processor(str(folder), "the test's folder")


def reference_run(folder: Path, family: str, name: str):
    """The plain loop: returns each step's loss and grad norm, the trained parameters and the frozen ones."""
    from transformers import AutoModelForImageTextToText

    _, ranks, parallel, train, freeze = CASES[name]
    processor = processor_of(folder)
    data = conversations()
    qlora = train.get("method") == "qlora"  # a QLoRA user loads the base in bf16 and quantises the adapted linears
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.bfloat16 if qlora else torch.float32)
    if train.get("method") in ("lora", "qlora"):
        shards = ranks if parallel["backend"] == "fsdp2" else 1  # NF4 blocks whole on every FSDP2 shard
        model = with_adapters(model, nf4_shards=shards if qlora else 0)
    for part in freeze:  # the vision tower without its projector (Qwen's merger sits inside model.visual)
        assert part == "vision_tower"
        tower = next(n for n, _ in model.named_modules() if n.rsplit(".", 1)[-1] in VISION_TOWERS)
        for n, p in model.named_parameters():
            if n.startswith(tower + ".") and ".merger." not in n:
                p.requires_grad_(False)
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    micro = parallel["micro_batch_size"]
    out = []
    for step in range(STEPS):
        index = global_batch(step, len(data))
        batches = []
        for start in range(0, GLOBAL_BATCH, micro):
            chosen = [data[i] for i in index[start : start + micro]]
            texts = [processor.apply_chat_template(m, tokenize=False) for m, _ in chosen]
            inputs = processor(
                text=texts,
                images=[imgs for _, imgs in chosen],
                return_tensors="pt",
                padding="max_length",
                max_length=SEQ_LEN[family],
            )
            batches.append((dict(inputs), assistant_labels(inputs["input_ids"], processor.tokenizer)))
        count = sum(int((labels != -100).sum()) for _, labels in batches)
        loss_sum = 0.0
        for inputs, labels in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=qlora):
                logits = model(**inputs).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum")
            (loss / count).backward()
            loss_sum += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(trained, CLIP)
        opt.step()
        opt.zero_grad()
        out.append({"loss": loss_sum / count, "grad_norm": norm.item()})
    named = dict(model.named_parameters())
    state = {own_name(n): p.detach().clone() for n, p in named.items() if p.requires_grad}
    return out, state


def own_name(name: str) -> str:
    """A parameter of the peft-wrapped reference under the model's own name (what bigtrain's state dict holds)."""
    return name.removeprefix("base_model.model.").replace(".default", "")


def with_adapters(model, nf4_shards: int = 0):
    """peft's LoRA on the language model's decoder linears; each ``lora_A`` from bigtrain's documented initial
    values (seeded by train.seed and the adapter's name). ``nf4_shards`` > 0: QLoRA, the adapters in fp32 and each
    adapted linear's base quantised with torchao's own ``to_nf4`` (64 values a scale; the second-level block halved
    until each of the FSDP2 shards holds whole ones, as bigtrain's ``nf4_scaler_block`` does at these tiny widths)."""
    from peft import LoraConfig, get_peft_model

    from bigtrain.parallel.transforms.adapters import initial_lora_A

    language = next(n for n, _ in model.named_modules() if n.rsplit(".", 1)[-1] in ("language_model", "text_model"))
    names = "q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj"
    config = LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, target_modules=rf"{language}\..*\.({names})")
    model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.data = param.data.float()
            if ".lora_A." in name:
                param.copy_(initial_lora_A(own_name(name), tuple(param.shape), SEED))
    if nf4_shards:
        quantize_adapted_bases(model, nf4_shards)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm")
    made: dict[str, Path] = {}

    def folder(family: str) -> Path:
        if family not in made:
            made[family] = save_tiny_vlm(root / family, family)
        return made[family]

    return folder


def recipe_for(folder: Path, name: str, output_dir: Path) -> dict:
    family, _, parallel, train, freeze = CASES[name]
    recipe = recipe_dict(
        output_dir,
        "builtin:image_chat",
        folder,
        data={"seq_len": SEQ_LEN[family], "shuffle": True},
        train={
            "steps": STEPS,
            "global_batch_size": GLOBAL_BATCH,
            "lr": LR,
            "lr_schedule": "constant",
            "grad_clip": CLIP,
            "seed": SEED,
            **train,
        },
        parallel=parallel,
        checkpoint={"save_final_model": False},
    )
    recipe["model"]["freeze"] = list(freeze)
    if train.get("method") in ("lora", "qlora"):
        recipe = with_sections(recipe, lora={"r": LORA_R, "alpha": LORA_ALPHA})
    return recipe


@pytest.fixture(scope="module")
def launches(folders, tmp_path_factory, request):
    shared = SharedLaunches(tmp_path_factory, "vlm")
    chosen = selected(request.session, "test_vision_language_plan_matches_a_plain_loop", "name")
    cases = {
        name: (
            launch_key(CASES[name][1], CASES[name][2]),
            lambda out, name=name: recipe_for(folders(CASES[name][0]), name, out),
        )
        for name in chosen
    }
    return lambda name: shared.get(name, cases)


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.full] if n in FULL_ONLY else []) for n in CASES])
def test_vision_language_plan_matches_a_plain_loop(name, folders, launches):
    from transformers import AutoModelForImageTextToText

    family, _, _, _, freeze = CASES[name]
    run = launches(name)
    run.check_finished()
    expected, trained = reference_run(folders(family), family, name)
    got = read_metrics(run.output_dir)
    assert len(got) == STEPS
    rtol, atol = (QLORA_RTOL, QLORA_ATOL) if CASES[name][3].get("method") == "qlora" else (RTOL, PARAM_ATOL)
    for step, (g, e) in enumerate(zip(got, expected, strict=True), 1):
        assert g["loss"] == pytest.approx(e["loss"], rel=rtol), (step, g["loss"], e["loss"])
        assert g["grad_norm"] == pytest.approx(e["grad_norm"], rel=rtol), (step, g["grad_norm"], e["grad_norm"])
    params = torch.load(run.params)
    for key, value in trained.items():
        torch.testing.assert_close(params[key], value.float(), rtol=0, atol=atol, msg=lambda m, k=key: f"{k}: {m}")
    if freeze:  # the frozen tower: in the checkpoint's state, and bit-identical to the starting folder
        start = AutoModelForImageTextToText.from_pretrained(folders(family), dtype=torch.float32).state_dict()
        frozen = [k for k in params if k not in trained]
        assert frozen, "no frozen parameter in the state"
        for key in frozen:
            assert torch.equal(params[key], start[key]), key
