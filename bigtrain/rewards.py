"""Reward functions shipped with bigtrain, for ``train.reward_functions`` (``bigtrain.rewards:NAME``), with TRL's
signature: ``f(prompts, completions, completion_ids, **fields) -> list[float | None]``, the record's fields as lists.
Your own live in any module on the Python path; these serve the toy recipe (``recipes/grpo_lora.yaml``) and examples.
"""

from __future__ import annotations

from typing import Any


def _text(completion: Any) -> str:
    """A completion's text: itself, or a chat completion's last message's content."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


def exact_answer(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], answer: list[str],
                 **fields: Any) -> list[float]:  # fmt: skip
    """1 where the completion's text, stripped of surrounding space, is the record's ``answer``; else 0."""
    return [1.0 if _text(c).strip() == str(a).strip() else 0.0 for c, a in zip(completions, answer, strict=True)]


def answer_first(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], answer: list[str],
                 **fields: Any) -> list[float]:  # fmt: skip
    """1 where the completion starts with the record's ``answer`` (the rest ignored), else 0: a gentler signal than
    exact_answer for a model that has not learnt to stop."""
    return [1.0 if _text(c).lstrip().startswith(str(a)) else 0.0 for c, a in zip(completions, answer, strict=True)]
