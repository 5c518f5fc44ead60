"""Preference objectives on real multi-rank plans against a plain single-process loop, step for step.

The plain loop is written from the papers' formulas, not from bigtrain: the pairs tokenised with the byte tokenizer's
rule (a prompt's bytes, the answer's bytes, the end-of-text id 256) into rows of SEQ_LEN, the global batch's chosen
and rejected rows in one forward, each answer's log-probability summed (dpo, ipo) or averaged (orpo, simpo), the
reference's from a frozen copy of the starting model (full fine-tuning) or peft's ``disable_adapter`` (LoRA), the mean
loss over the batch's pairs, AdamW, ``clip_grad_norm_``, the schedule and data order of ``test_equivalence.py``.
Compared each step: the loss, the gradient norm and every reported metric (rewards/chosen, rewards/rejected,
rewards/margins, rewards/accuracies, logps/chosen, logps/rejected); then every trained parameter.

Cases: dpo with LoRA on FSDP2 x 2 and ZeRO-3 x 2 (the reference is the adapter-disabled base), full dpo on FSDP2 x 2
with its reference sharded, offloaded and precomputed, on HSDP 2x1, ZeRO-3 x 2 and ZeRO-2 x 2 (a whole copy on each
rank) with it sharded and on DDP x 2 with it precomputed, orpo and simpo on FSDP2 x 2, ipo on DDP x 2; each with accumulation (micro-batches of 2 pairs,
4 pairs per rank). The teeth: a reference that drifts with the policy, or pairs whose rejected answer comes from
another pair (a pair split across micro-batches), move the loop's numbers far beyond the tolerance.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import read_metrics, recipe_dict, save_tiny_model
from shared_launch import SharedLaunches, launch_key, selected
from test_adapters import ALPHA, TARGETS, R
from test_equivalence import BETAS, CLIP, EPS, LR, NUM_ROWS, SEED, WD, global_batch_rows, lr_lambda
from test_equivalence import train_section as sft_train_section

from bigtrain.losses.preference import SUMMED
from bigtrain.parallel.transforms.adapters import initial_lora_A

STEPS = 10
SEQ_LEN = 40
EOS = 256
BETA = 0.5
# SimPO at its paper's settings (beta 2-2.5, gamma 0.5-1.6). At beta 0.5, gamma 0.4 the gradient of step 9 is so
# cancelled that the fp32 plain loop's own norm is 1.2e-5 from an fp64 run of it: no fp32 order could match to 1e-5.
SIMPO_BETA, GAMMA = 2.0, 1.0
RTOL, ATOL = 1e-5, 1e-6  # per step; ATOL for values that start at zero (the rewards of step 1)
PARAM_ATOL = 2e-5
METRICS = (*SUMMED, "rewards/margins")  # every metric a step reports
FSDP = dict(backend="fsdp2", micro_batch_size=2)
DDP = dict(backend="ddp", micro_batch_size=2)
ZERO3 = dict(backend="deepspeed", zero_stage=3, micro_batch_size=2)
ZERO2 = dict(backend="deepspeed", zero_stage=2, micro_batch_size=2)

# name -> (objective, method, parallel, reference the loop uses: "copy" or "adapters" or None)
CASES = {
    "dpo-lora-fsdp2-adapter_disabled": ("dpo", "lora", {**FSDP, "reference": "adapter_disabled"}),
    "dpo-full-fsdp2-sharded": ("dpo", "full", {**FSDP, "reference": "sharded"}),
    "dpo-full-fsdp2-offloaded": ("dpo", "full", {**FSDP, "reference": "offloaded"}),
    "dpo-full-fsdp2-precomputed": ("dpo", "full", {**FSDP, "reference": "precomputed"}),
    "dpo-full-zero3-sharded": ("dpo", "full", {**ZERO3, "reference": "sharded"}),
    "dpo-full-zero2-sharded": ("dpo", "full", {**ZERO2, "reference": "sharded"}),  # a whole copy on each rank
    "dpo-lora-zero3-adapter_disabled": ("dpo", "lora", {**ZERO3, "reference": "adapter_disabled"}),
    "dpo-full-hsdp-sharded": ("dpo", "full", {**FSDP, "dp_replicate": 2, "dp_shard": 1, "reference": "sharded"}),
    "dpo-full-ddp-precomputed": ("dpo", "full", {**DDP, "reference": "precomputed"}),
    "orpo-fsdp2": ("orpo", "full", FSDP),
    "simpo-fsdp2": ("simpo", "full", FSDP),
    "ipo-ddp": ("ipo", "full", {**DDP, "reference": "sharded"}),
}
FULL_ONLY = {
    "dpo-full-fsdp2-offloaded",
    "ipo-ddp",
    "dpo-full-zero3-sharded",
    "dpo-full-zero2-sharded",
    "dpo-lora-zero3-adapter_disabled",
    "dpo-full-hsdp-sharded",
}
THREE_REFERENCES = ("dpo-full-fsdp2-sharded", "dpo-full-fsdp2-offloaded", "dpo-full-fsdp2-precomputed")


def pairs() -> list[dict[str, str]]:
    """Arithmetic questions with a right and a wrong answer of other lengths (some answers cut by SEQ_LEN)."""
    rng = np.random.default_rng(3)
    out = []
    for _ in range(NUM_ROWS):
        a, b = (int(x) for x in rng.integers(1, 60, 2))
        wrong = a + b + int(rng.integers(1, 9))
        out.append(
            {"prompt": f"{a}+{b}=", "chosen": f"{a + b}", "rejected": f"maybe {wrong}, or {wrong + 1}" * (a % 3)}
        )
    for p in out:  # an empty rejected answer is bad input: give those a short wrong one
        p["rejected"] = p["rejected"] or "no"
    return out


def tokenise(pair: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """[2, SEQ_LEN] ids (chosen, rejected), right-padded with EOS, and [2, SEQ_LEN] which positions predict answers."""
    prompt = list(pair["prompt"].encode())
    ids, predicts = np.full((2, SEQ_LEN), EOS), np.zeros((2, SEQ_LEN), dtype=bool)
    for i, side in enumerate(("chosen", "rejected")):
        row = (prompt + list(pair[side].encode()) + [EOS])[:SEQ_LEN]
        ids[i, : len(row)] = row
        predicts[i, len(prompt) - 1 : len(row) - 1] = True  # position t predicts token t + 1
    return ids, predicts


def answer_logps(model, ids: torch.Tensor, predicts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(input_ids=ids).logits.float()
    token = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    mask = predicts[:, :-1]
    return (token * mask).sum(1), mask.sum(1).float()


def pair_losses(objective: str, c, r, n_c, n_r, ref_c, ref_r):
    """Per-pair loss and (chosen, rejected) rewards and logps, as each paper writes them."""
    if objective in ("orpo", "simpo"):
        c, r = c / n_c, r / n_r
        if objective == "simpo":
            loss = -F.logsigmoid(SIMPO_BETA * (c - r) - GAMMA)
            return loss, (SIMPO_BETA * c, SIMPO_BETA * r), (c, r)
        else:
            odds = lambda p: p - torch.log(1 - torch.exp(p))  # noqa: E731
            loss = -c - BETA * F.logsigmoid(odds(c) - odds(r))
        return loss, (BETA * c, BETA * r), (c, r)
    if objective == "ipo":
        loss = ((c - ref_c) / n_c - (r - ref_r) / n_r - 1 / (2 * BETA)) ** 2
    else:
        loss = -F.logsigmoid(BETA * ((c - ref_c) - (r - ref_r)))
    return loss, (BETA * (c - ref_c), BETA * (r - ref_r)), (c, r)


def plain_loop(model_dir, data, objective: str, method: str, drift: bool = False, swap: bool = False):
    """(metrics per step, parameters after the last step) of the loop a user would write."""
    from transformers import AutoModelForCausalLM

    ids, predicts = data
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    frozen = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval().requires_grad_(False)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS))
        for name, param in model.named_parameters():
            key = name.removeprefix("base_model.model.").replace(".default.", ".")
            if ".lora_A." in key:
                param.data.copy_(initial_lora_A(key, tuple(param.shape), SEED))
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    out = []
    for step in range(STEPS):
        at = global_batch_rows(step)
        rows = torch.from_numpy(np.concatenate([ids[at, 0], ids[at, 1]]))
        mask = torch.from_numpy(np.concatenate([predicts[at, 0], predicts[at, 1]]))
        logps, n = answer_logps(model, rows, mask)
        with torch.no_grad():
            if drift:  # the mistake: the reference moves with the policy
                ref = logps.detach()
            elif method == "lora":
                model.eval()
                with model.disable_adapter():
                    ref = answer_logps(model, rows, mask)[0]
                model.train()
            else:
                ref = answer_logps(frozen, rows, mask)[0]
        m = len(at)
        c, r, n_c, n_r = logps[:m], logps[m:], n[:m], n[m:]
        ref_c, ref_r = ref[:m], ref[m:]
        if swap:  # the mistake: each chosen answer meets another pair's rejected one
            r, n_r, ref_r = r.roll(1), n_r.roll(1), ref_r.roll(1)
        loss, (rc, rr), (lc, lr) = pair_losses(objective, c, r, n_c, n_r, ref_c, ref_r)
        loss.mean().backward()
        norm = torch.nn.utils.clip_grad_norm_(trained, CLIP)
        opt.step()
        schedule.step()
        opt.zero_grad()
        out.append(
            {
                "loss": loss.mean().item(),
                "grad_norm": norm.item(),
                "rewards/chosen": rc.mean().item(),
                "rewards/rejected": rr.mean().item(),
                "rewards/margins": (rc - rr).mean().item(),
                "rewards/accuracies": (rc > rr).float().mean().item(),
                "logps/chosen": lc.mean().item(),
                "logps/rejected": lr.mean().item(),
            }
        )
    if method == "lora":
        params = {
            n.removeprefix("base_model.model.").replace(".default.", "."): p.detach().clone()
            for n, p in model.named_parameters()
            if p.requires_grad
        }
    else:
        params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return out, params


def train_section(objective: str, method: str) -> dict:
    beta = SIMPO_BETA if objective == "simpo" else BETA
    return {**sft_train_section(STEPS), "objective": objective, "beta": beta, "simpo_gamma": GAMMA, "method": method}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("preference")
    records = pairs()
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in records))
    model_dir = save_tiny_model(root / "model", vocab_size=260)
    tokenised = [tokenise(p) for p in records]
    data = np.stack([t[0] for t in tokenised]), np.stack([t[1] for t in tokenised])
    return root, model_dir, data


@pytest.fixture(scope="module")
def loops(inputs):
    _, model_dir, data = inputs
    cache: dict = {}

    def get(objective: str, method: str):
        if (objective, method) not in cache:
            cache[objective, method] = plain_loop(model_dir, data, objective, method)
        return cache[objective, method]

    return get


def recipe(root, model_dir, name: str):
    objective, method, parallel = CASES[name]
    lora = {"r": R, "alpha": ALPHA, "dropout": 0.0} if method == "lora" else {}

    def make(out):
        sections = dict(
            data={"shuffle": True, "seq_len": SEQ_LEN},
            train=train_section(objective, method),
            parallel=parallel,
            checkpoint={"save_final_model": False},
        )
        if lora:
            sections["lora"] = lora
        return recipe_dict(out, root / "pairs.jsonl", model_dir, **sections)

    return make


@pytest.fixture(scope="module")
def launches(inputs, tmp_path_factory, request):
    root, model_dir, _ = inputs
    shared = SharedLaunches(tmp_path_factory, "preference")
    chosen = selected(request.session, "test_preference_plan_matches_the_plain_loop", "name")
    if any(
        getattr(item, "originalname", "") == "test_the_three_references_of_one_run_agree"
        for item in request.session.items
    ):
        chosen += [name for name in THREE_REFERENCES if name not in chosen]  # its runs, whichever tier selected
    cases = {n: (launch_key(2, CASES[n][2]), recipe(root, model_dir, n)) for n in chosen}
    return lambda name: shared.get(name, cases)


def assert_matches(got: list[dict], reference: list[dict]) -> None:
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for step, (mine, ref) in enumerate(zip(got, reference, strict=True), 1):
        for key in ("loss", "grad_norm", *METRICS):
            assert mine[key] == pytest.approx(ref[key], rel=RTOL, abs=ATOL), f"step {step} {key}"


TIERED = [pytest.param(n, marks=pytest.mark.full) if n in FULL_ONLY else n for n in CASES]


@pytest.mark.parametrize("name", TIERED)
def test_preference_plan_matches_the_plain_loop(name, launches, loops):
    objective, method, _ = CASES[name]
    reference, reference_params = loops(objective, method)
    launched = launches(name)
    launched.check_finished()
    assert_matches(read_metrics(launched.output_dir), reference)
    params = torch.load(launched.params)
    assert set(params) == set(reference_params)
    for key, ref in reference_params.items():
        torch.testing.assert_close(params[key], ref, rtol=0, atol=PARAM_ATOL, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.full  # with the offloaded case's launch
def test_the_three_references_of_one_run_agree(launches):
    """The sharded copy, the offloaded copy and the precomputed pass give one run the same numbers, each step."""
    runs = [read_metrics(launches(name).output_dir) for name in THREE_REFERENCES]
    for other in runs[1:]:
        assert_matches(other, runs[0])


def test_the_loop_is_not_vacuous(loops):
    reference, _ = loops("dpo", "full")
    assert reference[-1]["loss"] < 0.8 * reference[0]["loss"]
    assert reference[-1]["rewards/margins"] > 0.1
    assert sum(r["grad_norm"] > CLIP for r in reference) >= 3  # clipping is active


@pytest.mark.parametrize("mistake", ["drift", "swap"])
def test_a_drifting_reference_or_a_split_pair_is_caught(mistake, inputs, loops):
    _, model_dir, data = inputs
    reference, _ = loops("dpo", "full")
    wrong, _ = plain_loop(model_dir, data, "dpo", "full", **{mistake: True})
    worst = max(
        abs(w[k] - r[k]) / max(abs(r[k]), 1e-3)
        for w, r in zip(wrong, reference, strict=True)
        for k in ("loss", "grad_norm")
    )
    assert worst > 10 * RTOL, worst
    assert not math.isnan(worst)
