"""Reward functions of the grpo tests, named in their recipes as ``grpo_rewards:NAME`` (this folder is on the path of
the workers that train_and_save.py starts, and of the tests). TRL's signature: prompts, completions, completion_ids,
then the record's fields as lists. Both depend only on the completion and its record, never on its place in a batch."""

from __future__ import annotations


def answer_match(prompts, completions, completion_ids, answer, **fields):
    """A number from the first completion token and the record's answer: every value in [0, 1]."""
    return [((ids[0] + int(a)) % 5) / 4 for ids, a in zip(completion_ids, answer, strict=True)]


def shorter_text(prompts, completions, completion_ids, **fields):
    """Shorter decoded text scores higher; completions of a multiple of 3 tokens are not scored by this one (None)."""
    return [None if len(ids) % 3 == 0 else -0.05 * len(text) for ids, text in zip(completion_ids, completions, strict=True)]


def sum_is_right(prompts, completions, completion_ids, answer, **fields):
    """The toy recipe's reward: 1 when the completion's text, stripped, is the answer."""
    return [1.0 if text.strip() == a else 0.0 for text, a in zip(completions, answer, strict=True)]
