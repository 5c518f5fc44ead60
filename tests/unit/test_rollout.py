"""grpo's rollout pieces on their own: TRL's advantages, a completion's cut, the log-probabilities generation samples
with against the policy's forward (the check that catches stale weights), and the reward functions' one-line
errors."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from bigtrain.errors import ConfigError
from bigtrain.losses.grpo import entropy_sum
from bigtrain.roles.rewards import load_reward_function, score
from bigtrain.roles.rollout import SampledLogps, advantages_of, cut_completion

NAN = math.nan
EOS = 2


def test_group_advantages_are_trl_s():
    per_function = torch.tensor([[1.0, NAN], [0.0, 2.0], [1.0, 0.0], [0.5, NAN], [NAN, NAN], [2.0, 1.0]])
    weights = torch.tensor([1.0, 0.5])
    advantages, rewards, std = advantages_of(per_function, weights, 3, "group")
    expected_rewards = [1.0, 1.0, 1.0, 0.5, NAN, 2.5]
    torch.testing.assert_close(rewards, torch.tensor(expected_rewards), equal_nan=True)
    # group 1: all 1 -> std 0 -> advantage 0; group 2: mean 1.5 over the scored ones, std sqrt(2)
    second = torch.tensor([0.5, 2.5])
    spread = second.std()
    torch.testing.assert_close(advantages[:3], torch.zeros(3))
    torch.testing.assert_close(advantages[3], (0.5 - 1.5) / (spread + 1e-4))
    assert advantages[4] == 0  # no function scored it: no advantage
    torch.testing.assert_close(advantages[5], (2.5 - 1.5) / (spread + 1e-4))
    assert std[0] == 0 and std[3] == pytest.approx(float(spread))


def test_the_entropy_metric_sums_over_labelled_positions_only_and_steps_on_fake_tensors():
    logits = torch.randn(2, 5, 7)
    mask = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    logp = torch.log_softmax(logits / 0.7, dim=-1)
    expected = sum(-(logp[r, t].exp() * logp[r, t]).sum() for r in range(2) for t in range(5) if mask[r, t])
    torch.testing.assert_close(entropy_sum(logits, mask, 0.7), expected)
    # the planner's simulated step runs the loss on fake tensors: nothing of a data-dependent shape
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert entropy_sum(torch.randn(2, 5, 7), torch.ones(2, 5), 1.0).shape == ()


@pytest.mark.parametrize("scale", ["batch", "none"])
def test_batch_and_unscaled_advantages(scale):
    per_function = torch.tensor([[0.0], [1.0], [3.0], [5.0]])
    advantages, _, _ = advantages_of(per_function, torch.ones(1), 2, scale)
    centred = torch.tensor([-0.5, 0.5, -1.0, 1.0])
    expected = centred / (per_function.std() + 1e-4) if scale == "batch" else centred
    torch.testing.assert_close(advantages, expected)


def test_a_completion_ends_at_its_first_eos_or_the_limit():
    assert cut_completion([5, 6, 9, 7, 9], eos=9, limit=10) == ([5, 6, 9], False)
    assert cut_completion([5, 6, 7, 8], eos=9, limit=3) == ([5, 6, 7], True)
    assert cut_completion([5, 6, 7, 9], eos=9, limit=3) == ([5, 6, 7], True)


def _tiny(seed: int):
    from cases import TINY_LLAMA
    from transformers import AutoModelForCausalLM

    from bigtrain.config.hf import hf_config_from_dict

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(hf_config_from_dict({**TINY_LLAMA, "vocab_size": 64})).eval()


def _gap(generating, policy, temperature=0.7):
    """Generate from left-padded prompts of several lengths; the largest difference between the sampled tokens'
    log-probabilities and ``policy``'s forward of the right-padded rows."""
    prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    kept = SampledLogps(temperature)
    torch.manual_seed(0)
    with torch.no_grad():
        out = generating.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
            max_new_tokens=6, pad_token_id=0, eos_token_id=EOS, logits_processor=[kept],
        )  # fmt: skip
    sampled = kept.finish(out)
    gap = 0.0
    for i, p in enumerate(prompts):
        completion, _ = cut_completion(out[i, width:].tolist(), EOS, 6)
        row = torch.tensor([p + completion])
        with torch.no_grad():
            logits = policy(input_ids=row).logits[0, len(p) - 1 : -1].float() / temperature
        logps = torch.log_softmax(logits, -1).gather(-1, row[0, len(p) :, None]).squeeze(-1)
        gap = max(gap, float((logps - sampled[i, : len(completion)]).abs().max()))
    return gap


def test_generation_samples_with_the_policy_s_log_probabilities_and_stale_weights_are_seen():
    model = _tiny(0)
    assert _gap(model, model) < 1e-5
    assert _gap(_tiny(1), model) > 1e-2  # generation ran other weights (a sync that did not happen)


@pytest.fixture
def rewards_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def good(prompts, completions, completion_ids, answer, **kw):\n"
        "    return [1.0 if c == a else None for c, a in zip(completions, answer)]\n"
        "def short(prompts, completions, completion_ids, **kw):\n"
        "    return [1.0]\n"
        "def words(prompts, completions, completion_ids, **kw):\n"
        "    return ['high' for _ in completions]\n"
        "def picky(prompts, completions, completion_ids, **kw):\n"
        "    return [float(c) for c in completions]\n"
        "LIMIT = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def _score(module: str, name: str, completions: list[str]) -> list[float]:
    reward = load_reward_function(f"{module}:{name}", 0)
    fields = {"answer": ["1", "2", "3"][: len(completions)]}
    ids = [[1]] * len(completions)
    return score(reward, ["p"] * len(completions), completions, ids, fields, lambda i: f"record {i + 10}")


def test_a_reward_function_scores_with_none_as_not_scored(rewards_module):
    got = _score(rewards_module, "good", ["1", "x", "3"])
    assert got[0] == 1.0 and math.isnan(got[1]) and got[2] == 1.0


@pytest.mark.parametrize(
    "path, message",
    [
        ("my_rewards", "train.reward_functions[0]='my_rewards' is not module:function"),
        ("no_such_module:f", "module 'no_such_module' does not import (ModuleNotFoundError"),
        ("my_rewards:absent", "module 'my_rewards' has no 'absent'"),
        ("my_rewards:LIMIT", "module 'my_rewards' has a non-callable 'LIMIT'"),
    ],
)
def test_a_reward_function_that_cannot_be_loaded_is_one_line(path, message, rewards_module):
    with pytest.raises(ConfigError, match=None) as e:
        load_reward_function(path, 0)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "name, completions, message",
    [
        ("short", ["1", "2"], "reward function my_rewards:short returned 1 values for 2 completions"),
        ("words", ["1"], "reward function my_rewards:words returned 'high' for record 10; return a number"),
        ("picky", ["1", "two", "3"], "reward function my_rewards:picky raised ValueError: could not convert string to "
         "float: 'two' on record 11"),
    ],
)  # fmt: skip
def test_what_a_reward_function_returns_is_checked(name, completions, message, rewards_module):
    with pytest.raises(ConfigError) as e:
        _score(rewards_module, name, completions)
    assert message in str(e.value)


def test_a_folder_that_is_not_a_reward_model_is_refused(tmp_path):
    from helpers import save_tiny_model

    folder = save_tiny_model(tmp_path / "lm")  # a causal LM: no one-output head
    with pytest.raises(ConfigError) as e:
        load_reward_function(str(folder), 1)
    assert f"train.reward_functions[1]='{folder}' is not a reward model (a sequence classifier with one output" in str(
        e.value
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="is a folder without config.json"):
        load_reward_function(str(tmp_path / "empty"), 0)
