"""Chat fine-tuning trains the model a plain PyTorch loop trains on the assistant tokens only.

The data: chat conversations rendered with a ChatML template, packed two to a row (``packing: documents``). The
reference knows nothing of bigtrain's packing or masks: it runs every conversation *alone* (its own forward, positions
from 0) and takes the cross-entropy over the tokens transformers' own ``return_assistant_tokens_mask`` marks (the
template's ``{% generation %}`` blocks), summed over the global batch and divided by the number of those tokens.
bigtrain's runs (1 rank, FSDP2 x 2 ranks, pipeline 2 stages, DeepSpeed ZeRO-2 x 2; each with accumulation) must give the same loss,
gradient norm, held-out loss (every 2 steps, over conversations fewer than a global batch) and parameters: a prompt token in the loss, a wrong count, a document attending to its neighbour or a
position not restarting would each show.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from helpers import hf_assistant_mask, read_metrics, recipe_dict, save_chat_tokenizer, save_tiny_model
from shared_launch import SharedLaunches, launch_key, selected

STEPS = 4
GLOBAL_BATCH = 8  # rows of two conversations each
CONVERSATIONS = 32  # 16 rows: the run crosses an epoch
EVAL_CONVERSATIONS = 6  # 3 rows: less than a global batch, so the evaluation pads with label-less rows
EVAL_EVERY = 2
CONV_TOKENS = 40  # every conversation renders to exactly 40 byte tokens, so two fill a row of 80
LR, CLIP = 5e-3, 1.0
LOSS_RTOL = 1e-6
NORM_RTOL = 1e-5
PARAM_ATOL = 1e-5  # Adam noise on near-zero gradients: measured 2.4e-6 after 4 steps


def conversations(count: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        u = rng.randint(4, 12)  # ChatML costs 21 tokens for a user and an assistant turn: u + a = 19
        user = "".join(rng.choice("abcdefghij") for _ in range(u))
        answer = (user[::-1] + "klmnopqrstuvwxyz")[: 19 - u]
        out.append([{"role": "user", "content": user}, {"role": "assistant", "content": answer}])
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    tok = save_chat_tokenizer(root / "model")
    model_dir = save_tiny_model(root / "model", vocab_size=259, tie_word_embeddings=False)  # untied: pp can split it
    encoded = {}
    for name, count, seed in (("chat", CONVERSATIONS, 0), ("eval", EVAL_CONVERSATIONS, 1)):
        convs = conversations(count, seed)
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs))
        encoded[name] = [hf_assistant_mask(tok, c) for c in convs]
        assert all(len(ids) == CONV_TOKENS for ids, _ in encoded[name])
    padded = reference_run(model_dir, encoded["chat"], encoded["eval"], per_row=1)
    return root, model_dir, encoded["chat"], reference_run(model_dir, encoded["chat"], encoded["eval"]), padded


def assistant_loss_sum(model, ids, mask) -> tuple[torch.Tensor, int]:
    """One conversation alone: summed cross-entropy over the tokens transformers marks as the assistant's."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    keep = torch.tensor(mask[1:], dtype=torch.bool)
    loss = torch.nn.functional.cross_entropy(logits[keep], torch.tensor(ids[1:])[keep], reduction="sum")
    return loss, int(keep.sum())


def reference_run(model_dir, encoded, held_out=(), per_row=2):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.0)
    rows = len(encoded) // per_row
    metrics = []
    for step in range(STEPS):
        total = torch.zeros(())
        count = 0
        for position in range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH):
            row = position % rows  # data.shuffle: false, file order
            for ids, mask in encoded[per_row * row : per_row * (row + 1)]:
                loss, n = assistant_loss_sum(model, ids, mask)
                total, count = total + loss, count + n
        loss = total / count
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        metrics.append({"loss": loss.item(), "grad_norm": norm.item()})
        if held_out and (step + 1) % EVAL_EVERY == 0:
            model.eval()
            with torch.no_grad():
                sums = [assistant_loss_sum(model, ids, mask) for ids, mask in held_out]
            model.train()
            metrics[-1]["eval_loss"] = float(sum(s for s, _ in sums)) / sum(n for _, n in sums)
    return metrics, {k: v.detach().clone() for k, v in model.state_dict().items()}


PLANS = {
    "1rank-accum2": (1, dict(backend="fsdp2", micro_batch_size=4)),
    "fsdp2-2ranks-accum2": (2, dict(backend="fsdp2", micro_batch_size=2)),
    "pp2-1f1b-accum4": (2, dict(backend="fsdp2", pp=2, pp_schedule="1f1b", micro_batch_size=2)),
    "deepspeed-zero2-accum2": (2, dict(backend="deepspeed", zero_stage=2, micro_batch_size=2)),
    # data.packing: pad, one conversation per row of 80, each micro-batch cut to its longest row (40 tokens)
    "pad-fsdp2-2ranks-accum2": (2, dict(backend="fsdp2", micro_batch_size=2)),
}
PADDED = {"pad-fsdp2-2ranks-accum2"}


def chat_recipe(root: Path, model_dir: Path, parallel: dict, out: Path, packing: str = "documents") -> dict:
    data = {"eval_path": str(root / "eval.jsonl"), "seq_len": 2 * CONV_TOKENS, "shuffle": False, "packing": packing}
    return recipe_dict(
        out,
        root / "chat.jsonl",
        model_dir,
        data=data,
        train={
            "steps": STEPS,
            "global_batch_size": GLOBAL_BATCH,
            "lr": LR,
            "lr_schedule": "constant",
            "adam_eps": 1e-6,
            "grad_clip": CLIP,
            "eval_every": EVAL_EVERY,
        },
        parallel=parallel,
        checkpoint={"save_final_model": False},
    )


@pytest.fixture(scope="module")
def launches(setup, tmp_path_factory, request):
    """``launches(name)``: the launch that trained the plan (shared_launch.py: one per world size and engine)."""
    root, model_dir, _, _, _ = setup
    shared = SharedLaunches(tmp_path_factory, "chat")
    chosen = selected(request.session, "test_chat_plan_matches_assistant_only_loop", "name")
    cases = {
        n: (
            launch_key(*PLANS[n]),
            lambda out, n=n: chat_recipe(root, model_dir, PLANS[n][1], out, "pad" if n in PADDED else "documents"),
        )
        for n in chosen
    }
    return lambda name: shared.get(name, cases)


@pytest.mark.parametrize(  # the full tier adds DeepSpeed (its engine runs the same objective: default-tier cases)
    "name", [pytest.param(n, marks=pytest.mark.full) if n.startswith("deepspeed") else n for n in PLANS]
)
def test_chat_plan_matches_assistant_only_loop(name, setup, launches):
    _, _, _, (reference, reference_params), padded = setup
    if name in PADDED:  # rows of one conversation: another global batch, so another reference
        reference, reference_params = padded
    launched = launches(name)
    launched.check_finished()
    got = read_metrics(launched.output_dir)
    for step, (mine, ref) in enumerate(zip(got, reference, strict=True), 1):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=LOSS_RTOL), f"step {step} loss"
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=NORM_RTOL), f"step {step} grad_norm"
        assert ("eval_loss" in mine) == ("eval_loss" in ref), f"step {step}: evaluated when due, only then"
        if "eval_loss" in ref:
            assert mine["eval_loss"] == pytest.approx(ref["eval_loss"], rel=LOSS_RTOL), f"step {step} eval_loss"
            assert mine["eval_perplexity"] == pytest.approx(math.exp(ref["eval_loss"]), rel=LOSS_RTOL * 10)
    params = torch.load(launched.params)
    for key, ref in reference_params.items():
        torch.testing.assert_close(params[key], ref, rtol=0, atol=PARAM_ATOL, msg=lambda m, k=key: f"{k}: {m}")


def test_the_reference_sees_a_prompt_token_in_the_loss(setup):
    """The check's power: counting one more (prompt) token per conversation moves the first loss far beyond 1e-6."""
    _, model_dir, encoded, (reference, _), _ = setup
    widened = [(ids, [1 if i == mask.index(1) - 1 else m for i, m in enumerate(mask)]) for ids, mask in encoded]
    metrics, _ = reference_run(model_dir, widened)
    assert abs(metrics[0]["loss"] / reference[0]["loss"] - 1) > 100 * LOSS_RTOL
