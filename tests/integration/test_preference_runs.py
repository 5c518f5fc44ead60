"""Preference runs as a user starts them: bad pairs and bad settings refused in one line before any process group;
a run stopped mid-way and resumed equals the run that never stopped, for each reference (the precomputed
log-probabilities read back, not computed again); chat pairs through the tokenizer's chat template."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import read_metrics, recipe_dict, save_tiny_model, write_recipe

from bigtrain.config.load import load_recipe
from bigtrain.data.tokenizer import save_byte_tokenizer
from bigtrain.errors import ConfigError
from bigtrain.roles.reference_pass import FOLDER
from bigtrain.runtime import LaunchEnv
from bigtrain.train.run import TrainingJob, run_training

PAIRS = [
    {"prompt": f"{i} times 3 is ", "chosen": f"{3 * i}.", "rejected": f"{3 * i + 1 + i % 4}, or near it."}
    for i in range(24)
]


def _write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = save_tiny_model(tmp_path_factory.mktemp("pref_model") / "model", vocab_size=260)
    save_byte_tokenizer(folder)  # a ChatML chat template for the chat pairs
    return folder


def _recipe(tmp_path, model_dir, data_path, method="full", **parallel) -> dict:
    recipe = recipe_dict(
        tmp_path / "out",
        data_path,
        model_dir,
        data={"seq_len": 40, "shuffle": True},
        train={
            "steps": 6,
            "global_batch_size": 4,
            "objective": "dpo",
            "lr": 3e-3,
            "lr_schedule": "constant",
            "method": method,
        },  # fmt: skip
        parallel={"backend": "fsdp2", "micro_batch_size": 2, **parallel},
        checkpoint={"every": 3, "save_final_model": False},
    )
    if method == "lora":
        recipe["lora"] = {"r": 4, "alpha": 8}
    return recipe


def _refused(tmp_path, recipe: dict) -> str:
    env = LaunchEnv(rank=1, world_size=2, local_rank=1, local_world_size=2, launched=True)
    with pytest.raises(ConfigError) as e:  # the recipe as bigtrain train reads it, then a rank's start-up
        TrainingJob(load_recipe(write_recipe(tmp_path / "bad.yaml", recipe)), env)
    return str(e.value)


BAD_PAIRS = {
    "an empty prompt": ({"prompt": "", "chosen": "b", "rejected": "c"}, "line 3: the prompt is empty"),
    "an empty side": ({"prompt": "a", "chosen": "", "rejected": "b"}, "line 3: 'chosen' is empty"),
    "a missing side": ({"prompt": "a", "chosen": "b"}, "line 3: no 'rejected' field"),
    "a prompt longer than max_length": (
        {"prompt": "x" * 60, "chosen": "b", "rejected": "c"},
        "line 3: the prompt is 60 tokens, which leaves no room for an answer in data.seq_len=40",
    ),
}


@pytest.mark.parametrize("case", list(BAD_PAIRS))
def test_a_bad_pair_is_named_by_its_line(case, tmp_path, model_dir):
    record, message = BAD_PAIRS[case]
    path = _write(tmp_path / "pairs.jsonl", [PAIRS[0], PAIRS[1], record])
    assert message in _refused(tmp_path, _recipe(tmp_path, model_dir, path))


def test_pairs_that_never_differ_are_refused(tmp_path, model_dir):
    same = [{"prompt": p["prompt"], "chosen": p["chosen"], "rejected": p["chosen"]} for p in PAIRS]
    message = _refused(tmp_path, _recipe(tmp_path, model_dir, _write(tmp_path / "same.jsonl", same)))
    assert "in every pair the chosen and the rejected answer are the same tokens" in message


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r["parallel"].update(reference="adapter_disabled"), "parallel.reference=adapter_disabled needs"),
        (
            lambda r: (
                r["train"].update(method="lora")
                or r.update(lora={"modules_to_save": ["embed_tokens"]})
                or r["parallel"].update(reference="adapter_disabled")
            ),
            "with lora.modules_to_save=['embed_tokens']: those modules train fully",
        ),
        (lambda r: r["train"].update(objective="orpo", label_smoothing=0.1), "train.label_smoothing=0.1 applies"),
        (lambda r: r["train"].update(beta=0.0), "train.beta=0 with train.objective=dpo trains nothing"),
        (lambda r: r["parallel"].update(tp=2), "parallel.tp=2 with train.objective=dpo is not built yet"),
    ],
)
def test_bad_settings_get_one_line(change, message, tmp_path, model_dir):
    recipe = _recipe(tmp_path, model_dir, _write(tmp_path / "pairs.jsonl", PAIRS))
    change(recipe)
    assert message in _refused(tmp_path, recipe)


REFERENCES = {
    "sharded": ("full", {"reference": "sharded"}),
    "offloaded": ("full", {"reference": "offloaded"}),
    "precomputed": ("full", {"reference": "precomputed"}),
    "adapter_disabled": ("lora", {"reference": "adapter_disabled"}),
}


def _run(recipe: dict, path) -> list[dict]:
    run_training(load_recipe(write_recipe(path, recipe)))
    return read_metrics(recipe["output_dir"])


# the default tier: the file read back and the adapters switched off; the full tier the frozen copies too
TIERED = [r if r in ("precomputed", "adapter_disabled") else pytest.param(r, marks=pytest.mark.full) for r in REFERENCES]


@pytest.mark.parametrize("reference", TIERED)
def test_a_resumed_run_equals_the_run_that_never_stopped(reference, tmp_path, model_dir):
    method, parallel = REFERENCES[reference]
    data = _write(tmp_path / "pairs.jsonl", PAIRS)
    straight = _recipe(tmp_path / "straight", model_dir, data, method, **parallel)
    whole = _run(straight, tmp_path / "straight.yaml")
    stopped = _recipe(tmp_path / "stopped", model_dir, data, method, **parallel)
    stopped["train"]["steps"] = 3
    _run(stopped, tmp_path / "first.yaml")
    stored = sorted((tmp_path / "stopped" / "out" / FOLDER).glob("*.npy"))
    assert len(stored) == (1 if reference == "precomputed" else 0)
    before = [f.stat().st_mtime_ns for f in stored]
    stopped["train"]["steps"] = 6
    resumed = _run(stopped, tmp_path / "second.yaml")
    assert [f.stat().st_mtime_ns for f in stored] == before  # read back, not computed again
    assert [r["step"] for r in resumed] == list(range(1, 7))
    for mine, theirs in zip(resumed, whole, strict=True):
        for key in ("loss", "grad_norm", "rewards/margins", "logps/chosen"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-7), (mine["step"], key)
    assert whole[-1]["rewards/margins"] > whole[0]["rewards/margins"]  # the run learns to prefer


def test_precomputed_equals_the_sharded_copy_with_held_out_pairs(tmp_path, model_dir):
    """The precomputed pass covers the training pairs and the held-out ones, each looked up by its own position in its
    split (a split's pairs are not the file's first ones): every step and evaluation as the live copy gives them."""
    data = _write(tmp_path / "pairs.jsonl", PAIRS)
    runs = {}
    for reference in ("sharded", "precomputed"):
        recipe = _recipe(tmp_path / reference, model_dir, data, reference=reference)
        recipe["data"]["eval_fraction"] = 0.25
        recipe["train"].update(steps=4, eval_every=2)
        runs[reference] = _run(recipe, tmp_path / f"{reference}.yaml")
    assert [r["step"] for r in runs["precomputed"] if "eval_loss" in r] == [2, 4]
    for mine, theirs in zip(runs["precomputed"], runs["sharded"], strict=True):
        for key in ("loss", "grad_norm", "rewards/margins", "eval_loss", "eval_rewards/margins"):
            if key in theirs:
                assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-7), (mine["step"], key)


def test_a_resume_without_its_precomputed_log_probabilities_is_refused(tmp_path, model_dir):
    data = _write(tmp_path / "pairs.jsonl", PAIRS)
    recipe = _recipe(tmp_path, model_dir, data, reference="precomputed")
    recipe["train"]["steps"] = 3
    _run(recipe, tmp_path / "first.yaml")
    for stored in (tmp_path / "out" / FOLDER).glob("*.npy"):
        stored.unlink()
    recipe["train"]["steps"] = 6
    with pytest.raises(ConfigError, match="parallel.reference=precomputed: .* is missing, and the policy has trained"):
        _run(recipe, tmp_path / "second.yaml")


def test_chat_pairs_mask_the_prompt_through_the_chat_template(tmp_path, model_dir):
    from bigtrain.config.schema import DataConfig
    from bigtrain.data.preference import load_preference_pairs

    chat = [
        {
            "prompt": [{"role": "user", "content": p["prompt"]}],
            "chosen": [{"role": "assistant", "content": p["chosen"]}],
            "rejected": [{"role": "assistant", "content": p["rejected"]}],
        }
        for p in PAIRS
    ]
    path = _write(tmp_path / "chat.jsonl", chat)
    pairs = load_preference_pairs(DataConfig(path=path, seq_len=64, tokenizer=str(model_dir)))
    batch = pairs.micro_batch(np.array([0]))
    ids, labels = batch.input_ids[0], batch.labels[0]
    text = bytes(int(t) for t in ids if t < 256).decode()
    assert text.startswith("<|im_start|>user\n0 times 3 is ") or "user\n0 times 3 is " in text
    predicted = bytes(int(t) for t in labels[labels >= 0] if t < 256).decode()
    # the answer and the template's end of turn (<|im_end|>, then its newline), never the prompt or the opening
    assert predicted == "0.\n"
    assert torch.equal(batch.input_ids[1][:5], ids[:5])  # chosen and rejected share the prompt
