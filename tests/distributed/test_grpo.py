"""grpo on real multi-rank plans against a plain single-process loop written from the papers' formulas.

The completions are fixed: drawn once from a seeded generator and written to a rollout replay that bigtrain reads
(``rollout.replay``) and the loop reads too, so both train on the same completions and the comparison isolates the
objective. Some completions end with the end-of-text id 256, some are cut by max_completion_length, one reward
function leaves some completions unscored (None).

The loop: generation g (steps g*MU .. g*MU + MU - 1) answers prompts [g*P, (g+1)*P), each NUM_GENERATIONS times in a
row; rewards are the weighted sum of the two functions (NaN-aware), advantages (r - mean of the group) / (std of the
group + 1e-4) (or of the batch); the generating policy's per-token log-probabilities are taken right after generation
(MU > 1), the reference's are the starting model's; each step is one forward of the whole global batch, with the
clipped surrogate, the k3 KL estimator times BETA, normalised as each loss_type says over the whole global batch;
AdamW, ``clip_grad_norm_``, the schedule of ``test_equivalence.py``. Compared each step: loss, gradient norm, reward,
KL and the clip ratio; then every trained parameter.

Cases: one rank, DDP x 2, FSDP2 x 2 and LoRA on FSDP2 x 2 (its reference the adapters switched off), across the loss
types and GSPO's sequence-level ratio, all with accumulation. The teeth: a reference that drifts, advantages scaled
over the batch instead of the group, the wrong loss_type's normalisation.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from grpo_rewards import answer_match, shorter_text
from helpers import read_metrics, recipe_dict, save_tiny_model
from shared_launch import SharedLaunches, launch_key, selected
from test_adapters import ALPHA, TARGETS, R
from test_equivalence import BETAS, CLIP, EPS, SEED, WD, lr_lambda
from test_equivalence import train_section as sft_train_section

from bigtrain.parallel.transforms.adapters import initial_lora_A

STEPS, MU, NUM_GENERATIONS, GLOBAL_BATCH = 6, 2, 4, 8
PROMPTS_PER_STEP = GLOBAL_BATCH // NUM_GENERATIONS
MAX_COMPLETION, EOS, TEMPERATURE, BETA, EPSILON = 12, 256, 0.9, 0.04, 0.2
WEIGHTS = (1.0, 0.5)
LR = 2e-3
RTOL, ATOL, PARAM_ATOL = 1e-5, 1e-6, 2e-5
COMPARED = ("loss", "grad_norm", "reward", "kl", "clip_ratio/region_mean")
FSDP = dict(backend="fsdp2", micro_batch_size=2)
DDP = dict(backend="ddp", micro_batch_size=2)
# name -> (ranks, method, parallel section, train keys beyond the common ones)
CASES = {
    "fsdp2": (2, "full", FSDP, {"loss_type": "dapo"}),
    "lora-fsdp2": (2, "lora", FSDP, {"loss_type": "grpo"}),
    "ddp": (2, "full", DDP, {"loss_type": "dr_grpo"}),
    "one-rank": (1, "full", DDP, {"loss_type": "dapo"}),
    "fsdp2-gspo": (
        2, "full", FSDP, {"loss_type": "grpo", "importance_sampling_level": "sequence", "scale_rewards": "batch"}
    ),
    "one-rank-bnpo": (1, "full", DDP, {"loss_type": "bnpo", "epsilon_high": 0.28}),
    "zero3": (2, "full", dict(backend="deepspeed", zero_stage=3, micro_batch_size=2), {"loss_type": "dapo"}),
}  # fmt: skip
FULL_ONLY = {"lora-fsdp2", "ddp", "one-rank", "fsdp2-gspo", "one-rank-bnpo", "zero3"}
# generation by the policy itself (no replay): name -> (ranks, method, parallel section)
ZERO3 = dict(backend="deepspeed", zero_stage=3, micro_batch_size=2)
GENERATING = {
    "generate-fsdp2": (2, "full", FSDP),
    "generate-lora-fsdp2": (2, "lora", FSDP),
    "generate-zero3": (2, "full", ZERO3),
}
GENERATING_FULL_ONLY = {"generate-lora-fsdp2", "generate-zero3"}
GAP = 1e-4  # the generation's log-probabilities against the policy's forward (fp32, CPU)


def prompt_records(digits: int = 10) -> list[dict]:
    rng = np.random.default_rng(11)
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in rng.integers(0, digits, size=(16, 2))]


def replay() -> list[list[list[int]]]:
    """Completions of each generation: random bytes of 1 to MAX_COMPLETION + 3 tokens, about half ending with EOS
    (those longer than MAX_COMPLETION are cut there, without it)."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(STEPS // MU):
        generation = []
        for _ in range(GLOBAL_BATCH):
            ids = rng.integers(0, 256, size=int(rng.integers(1, MAX_COMPLETION + 4))).tolist()
            generation.append(ids + [EOS] if rng.random() < 0.5 else ids)
        out.append(generation)
    return out


def completion_of(ids: list[int]) -> list[int]:
    """What the policy is trained on: up to the first EOS (included), at most MAX_COMPLETION tokens."""
    ids = ids[:MAX_COMPLETION]
    return ids[: ids.index(EOS) + 1] if EOS in ids else ids


def with_adapters(model):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_A." in name:
                own = name.removeprefix("base_model.model.").replace(".default", "")
                param.copy_(initial_lora_A(own, tuple(param.shape), SEED))
    return model


def token_logps(model, ids: torch.Tensor) -> torch.Tensor:
    """[rows, length - 1] log-probability of each next token under softmax(logits / TEMPERATURE)."""
    logits = model(input_ids=ids).logits[:, :-1].float() / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def advantages_of(rewards_per_function: torch.Tensor, scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted rewards (NaN where no function scored) and their group-relative advantages."""
    unscored = torch.isnan(rewards_per_function).all(1)
    rewards = torch.nansum(rewards_per_function * torch.tensor(WEIGHTS), 1)
    rewards[unscored] = math.nan
    advantages = torch.zeros(GLOBAL_BATCH)
    for start in range(0, GLOBAL_BATCH, NUM_GENERATIONS):
        group = rewards[start : start + NUM_GENERATIONS]
        seen = group[~torch.isnan(group)]
        spread = rewards[~torch.isnan(rewards)].std() if scale == "batch" else seen.std()
        advantages[start : start + NUM_GENERATIONS] = (group - seen.mean()) / (spread + 1e-4)
    return torch.nan_to_num(advantages), rewards


def generation_batch(g: int, records: list[dict], completions: list[list[int]]):
    """Generation g's rows (prompt + completion, right-padded), completion masks of the next-token targets, rewards."""
    prompts = [records[g * PROMPTS_PER_STEP + j // NUM_GENERATIONS] for j in range(GLOBAL_BATCH)]
    cut = [completion_of(c) for c in completions]
    rows = [list(p["prompt"].encode()) + c for p, c in zip(prompts, cut, strict=True)]
    width = max(map(len, rows))
    ids = torch.full((GLOBAL_BATCH, width), EOS)
    mask = torch.zeros((GLOBAL_BATCH, width - 1))
    for i, (row, c) in enumerate(zip(rows, cut, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, len(row) - len(c) - 1 : len(row) - 1] = 1  # the positions that predict the completion's tokens
    texts = [bytes(t for t in c if t < EOS).decode("utf-8", errors="replace") for c in cut]
    fields = dict(prompts=[p["prompt"] for p in prompts], completions=texts, completion_ids=cut)
    answers = [p["answer"] for p in prompts]
    per_function = [answer_match(**fields, answer=answers), shorter_text(**fields, answer=answers)]
    scores = torch.tensor([[math.nan if v is None else v for v in f] for f in per_function]).T
    return ids, mask, scores


def normalised(token_losses: torch.Tensor, mask: torch.Tensor, loss_type: str) -> torch.Tensor:
    if loss_type == "dapo":
        return token_losses.sum() / mask.sum()
    if loss_type == "grpo":
        return (token_losses.sum(1) / mask.sum(1)).mean()
    if loss_type == "dr_grpo":
        return token_losses.sum() / (GLOBAL_BATCH * MAX_COMPLETION)
    # bnpo: each micro-batch of two completions over its own tokens, then the mean over micro-batches
    parts = [token_losses[i : i + 2].sum() / mask[i : i + 2].sum() for i in range(0, GLOBAL_BATCH, 2)]
    return torch.stack(parts).mean()


def plain_loop(model_dir, records, generations, method, train, drifting=False, batch_scale=False, loss=None):
    """(metrics per step, trained parameters after the last step) of the loop a user would write."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    reference = copy.deepcopy(model).eval()
    if method == "lora":
        model = with_adapters(model)
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_lambda(step, STEPS))
    loss_type = loss or train["loss_type"]
    sequence = train.get("importance_sampling_level") == "sequence"
    scale = "batch" if batch_scale else train.get("scale_rewards", "group")
    low, high = EPSILON, train.get("epsilon_high", EPSILON)
    out = []
    for step in range(STEPS):
        if step % MU == 0:
            ids, mask, scores = generation_batch(step // MU, records, generations[step // MU])
            advantages, rewards = advantages_of(scores, scale)
            model.eval()
            with torch.no_grad():
                old = token_logps(model, ids)
                ref = token_logps(reference, ids)
        if drifting:  # the mistake: the reference follows the policy
            with torch.no_grad():
                ref = token_logps(model.eval(), ids)
        model.train()
        logps = token_logps(model, ids)
        log_ratio = (logps - old) * mask
        if sequence:
            log_ratio = (log_ratio.sum(1) / mask.sum(1))[:, None]
        ratio = torch.exp(log_ratio)
        a = advantages[:, None]
        surrogate = -torch.min(ratio * a, torch.clamp(ratio, 1 - low, 1 + high) * a)
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        token_losses = (surrogate + BETA * kl) * mask
        objective = normalised(token_losses, mask, loss_type)
        objective.backward()
        norm = torch.nn.utils.clip_grad_norm_(trained, CLIP)
        opt.step()
        schedule.step()
        opt.zero_grad()
        ratio = ratio.detach().expand_as(mask)
        clipped = (((ratio < 1 - low) & (a < 0)) | ((ratio > 1 + high) & (a > 0))).float() * mask
        out.append(
            {
                "loss": objective.item(),
                "grad_norm": norm.item(),
                "reward": torch.nanmean(rewards).item(),
                "kl": ((kl.detach() * mask).sum() / mask.sum()).item(),
                "clip_ratio/region_mean": (clipped.sum() / mask.sum()).item(),
            }
        )
    if method == "lora":
        state = {}
        for name, param in model.named_parameters():
            if param.requires_grad:
                state[name.removeprefix("base_model.model.").replace(".default", "")] = param.detach().clone()
        return out, state
    return out, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo")
    records, generations = prompt_records(), replay()
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    # prompts of 4 to 8 tokens: generation left-pads them, training right-pads the same rows
    varied = "".join(json.dumps(r) + "\n" for r in prompt_records(digits=1000))
    (root / "varied_prompts.jsonl").write_text(varied)
    (root / "replay.jsonl").write_text("".join(json.dumps({"completion_ids": g}) + "\n" for g in generations))
    model_dir = save_tiny_model(root / "model", seed=3, vocab_size=260, tie_word_embeddings=False)
    return root, model_dir, records, generations


@pytest.fixture(scope="module")
def loops(inputs):
    _, model_dir, records, generations = inputs
    cache: dict = {}

    def get(name: str, **mistakes):
        key = (name, tuple(sorted(mistakes.items())))
        if key not in cache:
            _, method, _, train = CASES[name]
            cache[key] = plain_loop(model_dir, records, generations, method, train, **mistakes)
        return cache[key]

    return get


def recipe(root, model_dir, name: str):
    if name in GENERATING:  # the policy generates: prompts of several lengths, no replay
        ranks, method, parallel = GENERATING[name]
        replayed = recipe(root, model_dir, "fsdp2")

        def generating(out):
            made = replayed(out)
            made["data"]["path"] = str(root / "varied_prompts.jsonl")
            made["train"].update(method=method, steps=4)
            if method == "lora":
                made["lora"] = {"r": R, "alpha": ALPHA, "dropout": 0.0}
            del made["rollout"]
            return made

        return generating
    ranks, method, parallel, train = CASES[name]

    def make(out):
        sections = dict(
            data={"shuffle": False},
            train={
                **sft_train_section(STEPS),
                "lr": LR,
                "method": method,
                "objective": "grpo",
                "beta": BETA,
                "epsilon": EPSILON,
                "num_generations": NUM_GENERATIONS,
                "num_iterations": MU,
                "max_completion_length": MAX_COMPLETION,
                "temperature": TEMPERATURE,
                "reward_functions": ["grpo_rewards:answer_match", "grpo_rewards:shorter_text"],
                "reward_weights": list(WEIGHTS),
                **train,
            },
            parallel=parallel,
            checkpoint={"save_final_model": False},
        )
        if method == "lora":
            sections["lora"] = {"r": R, "alpha": ALPHA, "dropout": 0.0}
        made = recipe_dict(out, root / "prompts.jsonl", model_dir, **sections)
        made["rollout"] = {"replay": str(root / "replay.jsonl")}
        return made

    return make


@pytest.fixture(scope="module")
def launches(inputs, tmp_path_factory, request):
    root, model_dir, _, _ = inputs
    shared = SharedLaunches(tmp_path_factory, "grpo")
    chosen = selected(request.session, "test_grpo_plan_matches_the_plain_loop", "name")
    chosen += selected(request.session, "test_generation_is_the_policy", "name")
    shape = {**{n: c[:3] for n, c in CASES.items()}, **GENERATING}
    cases = {n: (launch_key(shape[n][0], shape[n][2]), recipe(root, model_dir, n)) for n in chosen}
    return lambda name: shared.get(name, cases)


TIERED = [pytest.param(n, marks=pytest.mark.full) if n in FULL_ONLY else n for n in CASES]


@pytest.mark.parametrize("name", TIERED)
def test_grpo_plan_matches_the_plain_loop(name, launches, loops):
    reference, reference_params = loops(name)
    launched = launches(name)
    launched.check_finished()
    got = read_metrics(launched.output_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for step, (mine, ref) in enumerate(zip(got, reference, strict=True), 1):
        for key in COMPARED:
            assert mine[key] == pytest.approx(ref[key], rel=RTOL, abs=ATOL), f"step {step} {key}"
    params = torch.load(launched.params)
    assert set(params) == set(reference_params)
    for key, ref in reference_params.items():
        torch.testing.assert_close(params[key], ref, rtol=0, atol=PARAM_ATOL, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.full) if n in GENERATING_FULL_ONLY else n for n in GENERATING]
)
def test_generation_is_the_policy(name, launches):
    """The policy generates its completions (transformers' generate on the engine's model, FSDP2's units gathered per
    forward, LoRA applied; prompts left-padded): the log-probability it sampled each token with equals the policy's
    forward of the training row (right-padded) within GAP, at every generation, after steps have changed the weights
    (``rollout/logprob_gap``, measured where train.num_iterations > 1)."""
    launched = launches(name)
    launched.check_finished()
    got = read_metrics(launched.output_dir)
    gaps = [r["rollout/logprob_gap"] for r in got if "rollout/logprob_gap" in r]
    assert len(gaps) == 2 and all(g < GAP for g in gaps), gaps
    assert got[-1]["kl"] > 0  # the weights moved away from the reference before the second generation
    assert len({r["completions/mean_length"] for r in got}) > 1 or got[0]["completions/clipped_ratio"] < 1


def test_the_loop_moves_clips_and_penalises(loops):
    """The comparison has something to see: the ratio leaves 1 and gets clipped on the second step of a generation,
    the KL grows, the gradient is clipped."""
    reference, _ = loops("fsdp2")
    assert reference[0]["kl"] < 1e-9 and reference[-1]["kl"] > 1e-4
    assert any(r["clip_ratio/region_mean"] > 0 for r in reference[1::MU])
    assert sum(r["grad_norm"] > CLIP for r in reference) >= 2


@pytest.mark.full  # three more runs of the loop
@pytest.mark.parametrize(
    "mistake", [dict(drifting=True), dict(batch_scale=True), dict(loss="grpo")], ids=["drift", "batch", "loss"]
)
def test_a_drifting_reference_batch_advantages_or_another_normalisation_is_caught(mistake, loops):
    reference, _ = loops("fsdp2")
    wrong, _ = loops("fsdp2", **mistake)
    worst = max(
        abs(w[k] - r[k]) / max(abs(r[k]), 1e-3)
        for w, r in zip(wrong, reference, strict=True)
        for k in ("loss", "grad_norm")
    )
    assert worst > 10 * RTOL, worst
    assert not math.isnan(worst)
