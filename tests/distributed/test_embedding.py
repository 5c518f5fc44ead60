"""An embedding model (``model.task: embedding``, ``train.objective: contrastive``) on real multi-rank plans against a
plain single-process loop.

The plain loop is written from sentence-transformers' ``MultipleNegativesRankingLoss`` formula, not from bigtrain:
each record's anchor, positive and hard negative tokenised with the byte tokenizer's rule (the text's bytes, cut at
SEQ_LEN), the global batch's rows in one forward of transformers' ``BertModel`` (right-padded with 256 and an
attention mask), each row mean-pooled over its tokens, each anchor's cosine similarity to every positive and negative
of the *global* batch times 1 / temperature, the cross-entropy of its own positive averaged over the batch's anchors,
AdamW, ``clip_grad_norm_``, the schedule and data order of ``test_equivalence.py``. Compared each step: the loss, the
gradient norm and the accuracy (the anchors whose positive scores highest); then every trained parameter.

Cases: one rank, DDP x 2, FSDP2 x 2 (and with one micro-batch per rank, which needs no gradient cache: its forward
gathers the candidates with their graph) and ZeRO-3 x 2 (offloaded, selective checkpointing) on the BERT, and a decoder
embedder (transformers' ``LlamaModel``, each row's last token pooled) with peft's LoRA adapters on FSDP2 x 2 and on
ZeRO-3 x 2 (offloaded, every other block checkpointed); each with accumulation (micro-batches of 2
examples), so the negatives of every step come from 4 or 2 micro-batches and 2 ranks. The teeth: negatives from each
rank's micro-batch alone.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import read_metrics, recipe_dict
from shared_launch import SharedLaunches, launch_key, selected
from test_adapters import ALPHA, TARGETS, R
from test_equivalence import BETAS, CLIP, EPS, NUM_ROWS, SEED, global_batch_rows, lr_lambda
from test_equivalence import train_section as sft_train_section

from bigtrain.parallel.transforms.adapters import initial_lora_A

STEPS, SEQ_LEN, PAD, TEMPERATURE = 8, 32, 256, 0.05
LR = 2e-3
RTOL, ATOL, PARAM_ATOL = 1e-5, 1e-6, 2e-5
BERT = {"model_type": "bert", "vocab_size": 260, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0}  # fmt: skip
LLAMA = {"model_type": "llama", "vocab_size": 260, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}  # fmt: skip
POOLING = {"bert": "mean", "llama": "last_token"}
DS_OFFLOAD = dict(backend="deepspeed", zero_stage=3, micro_batch_size=2, offload_optimizer=True, offload_params=True)
# name -> (ranks, parallel section, model, method)
CASES = {
    "one-rank": (1, dict(backend="ddp", micro_batch_size=2), "bert", "full"),
    "ddp": (2, dict(backend="ddp", micro_batch_size=2), "bert", "full"),
    "fsdp2": (2, dict(backend="fsdp2", micro_batch_size=2), "bert", "full"),
    # one micro-batch per rank: no cache, the candidates gathered with their graph in the forward
    "fsdp2-whole-step": (2, dict(backend="fsdp2", micro_batch_size=4), "bert", "full"),
    "lora-decoder-fsdp2": (2, dict(backend="fsdp2", micro_batch_size=2), "llama", "lora"),
    # ZeRO-3 with its offloads, each with the checkpointing no other case pairs them with (tests/pairs.py)
    "zero2-offload-ac-selective": (
        2,
        dict(
            backend="deepspeed",
            zero_stage=2,
            micro_batch_size=2,
            offload_optimizer=True,
            activation_checkpointing="selective",
        ),
        "bert",
        "full",
    ),
    "lora-decoder-zero3-offload-ac-every2": (
        2,
        dict(DS_OFFLOAD, activation_checkpointing="full", checkpoint_every=2),
        "llama",
        "lora",
    ),
}
FULL_ONLY = {
    "one-rank",
    "ddp",
    "lora-decoder-fsdp2",
    "zero2-offload-ac-selective",
    "lora-decoder-zero3-offload-ac-every2",
}


def records() -> list[dict[str, str]]:
    """Questions about a numbered animal, the sentence about it, and one about another animal of that number (of other
    lengths, some cut by SEQ_LEN); no two texts alike, so no two candidates tie for the accuracy's first place."""
    rng = np.random.default_rng(7)
    animals = ["cat", "dog", "owl", "fox", "bee", "elk", "ant", "eel", "yak", "emu"]
    out = []
    for i in range(NUM_ROWS):
        a, b = rng.choice(len(animals), 2, replace=False)
        tail = " and then it runs far away over the hills" * (i % 3)
        out.append({"anchor": f"where is the {animals[a]} {i}?", "positive": f"the {animals[a]} {i} sits here{tail}",
                    "negative": f"the {animals[b]} {i} sits here{tail}"})  # fmt: skip
    return out


def tokenise(record: dict[str, str]) -> list[list[int]]:
    return [list(record[c].encode())[:SEQ_LEN] for c in ("anchor", "positive", "negative")]


def save_model(folder, kind: str = "bert"):
    from transformers import AutoConfig, AutoModel

    spec = dict(BERT if kind == "bert" else LLAMA)
    config = AutoConfig.for_model(spec.pop("model_type"), **spec, pad_token_id=PAD)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    return folder


def _embed(model, rows: list[list[int]], pooling: str = "mean") -> torch.Tensor:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, row in enumerate(rows):
        ids[k, : len(row)], mask[k, : len(row)] = torch.tensor(row), 1
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    if pooling == "last_token":
        return hidden[torch.arange(len(rows)), mask.sum(1) - 1]
    return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)


def with_adapters(model):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_A." in name:
                own = name.removeprefix("base_model.model.").replace(".default", "")
                param.copy_(initial_lora_A(own, tuple(param.shape), SEED))
    return model


def _losses(anchors, candidates):
    scores = F.normalize(anchors, dim=-1) @ F.normalize(candidates, dim=-1).T / TEMPERATURE
    labels = torch.arange(len(anchors))
    return F.cross_entropy(scores, labels, reduction="none"), (scores.argmax(-1) == labels).float()


def plain_loop(model_dir, data, local_negatives: int = 0, kind: str = "bert", method: str = "full"):
    """(metrics per step, trained parameters after the last step) of the loop a user would write; ``local_negatives``:
    the mistake of scoring each group of that many anchors against its own group's candidates only."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32)
    if method == "lora":
        model = with_adapters(model)
    model.train()
    trained = [p for n, p in model.named_parameters() if not n.startswith("pooler.") and p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=LR, betas=BETAS, eps=EPS, weight_decay=sft_train_section()["weight_decay"])
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_lambda(step, STEPS))
    out = []
    for step in range(STEPS):
        at = global_batch_rows(step)
        emb = _embed(model, [data[i][c] for c in range(3) for i in at], POOLING[kind]).view(3, len(at), -1)
        groups = (
            [np.arange(len(at))] if not local_negatives else np.split(np.arange(len(at)), len(at) // local_negatives)
        )
        losses, correct = [], []
        for g in groups:
            lo, co = _losses(emb[0, g], torch.cat([emb[1, g], emb[2, g]]))
            losses.append(lo)
            correct.append(co)
        loss = torch.cat(losses).mean()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(trained, CLIP)
        opt.step()
        schedule.step()
        opt.zero_grad()
        out.append({"loss": loss.item(), "grad_norm": norm.item(), "accuracy": torch.cat(correct).mean().item()})
    if method == "lora":
        names = {n.removeprefix("base_model.model.").replace(".default", ""): p for n, p in model.named_parameters()}
        return out, {k: p.detach().clone() for k, p in names.items() if p.requires_grad}
    return out, {k: v.detach().clone() for k, v in model.state_dict().items() if not k.startswith("pooler.")}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedding")
    data = records()
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    models = {kind: save_model(root / kind, kind) for kind in POOLING}
    return root, models, [tokenise(r) for r in data]


@pytest.fixture(scope="module")
def loops(inputs):
    _, models, data = inputs
    cache: dict = {}

    def get(kind: str = "bert", method: str = "full"):
        if (kind, method) not in cache:
            cache[kind, method] = plain_loop(models[kind], data, kind=kind, method=method)
        return cache[kind, method]

    return get


def recipe(root, models, name: str):
    _, parallel, kind, method = CASES[name]

    def make(out):
        # the pooling left to ``auto``: the family's (mean for BERT, the last token for a decoder)
        train = {**sft_train_section(STEPS), "lr": LR, "contrastive_temperature": TEMPERATURE, "method": method}
        sections = dict(data={"shuffle": True, "seq_len": SEQ_LEN}, train=train, parallel=parallel,
                        checkpoint={"save_final_model": False})  # fmt: skip
        if method == "lora":
            sections["lora"] = {"r": R, "alpha": ALPHA, "dropout": 0.0, "target_modules": TARGETS}
        made = recipe_dict(out, root / "pairs.jsonl", models[kind], **sections)
        made["model"]["task"] = "embedding"
        return made

    return make


@pytest.fixture(scope="module")
def launches(inputs, tmp_path_factory, request):
    root, models, _ = inputs
    shared = SharedLaunches(tmp_path_factory, "embedding")
    chosen = selected(request.session, "test_embedding_plan_matches_the_plain_loop", "name")
    cases = {n: (launch_key(CASES[n][0], CASES[n][1]), recipe(root, models, n)) for n in chosen}
    return lambda name: shared.get(name, cases)


TIERED = [pytest.param(n, marks=pytest.mark.full) if n in FULL_ONLY else n for n in CASES]


@pytest.mark.parametrize("name", TIERED)
def test_embedding_plan_matches_the_plain_loop(name, launches, loops):
    metrics, reference_params = loops(CASES[name][2], CASES[name][3])
    launched = launches(name)
    launched.check_finished()
    got = read_metrics(launched.output_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for step, (mine, ref) in enumerate(zip(got, metrics, strict=True), 1):
        for key in ("loss", "grad_norm", "accuracy"):
            assert mine[key] == pytest.approx(ref[key], rel=RTOL, abs=ATOL), f"step {step} {key}"
    params = torch.load(launched.params)
    params = {k: v for k, v in params.items() if not k.startswith("pooler.")}
    assert set(params) == set(reference_params)
    for key, ref in reference_params.items():
        torch.testing.assert_close(params[key], ref, rtol=0, atol=PARAM_ATOL, msg=lambda m, k=key: f"{k}: {m}")


def test_the_loop_learns_and_negatives_of_a_micro_batch_or_a_rank_alone_are_caught(inputs, loops):
    _, models, data = inputs
    metrics, _ = loops()
    assert metrics[-1]["loss"] < 0.7 * metrics[0]["loss"]
    for local in (2, 4):  # a micro-batch's negatives alone; a rank's of two (its half of the global batch)
        wrong, _ = plain_loop(models["bert"], data, local_negatives=local)
        worst = max(abs(w[k] - r[k]) / max(abs(r[k]), 1e-3) for w, r in zip(wrong, metrics, strict=True)
                    for k in ("loss", "grad_norm"))  # fmt: skip
        assert worst > 10 * RTOL, (local, worst)
