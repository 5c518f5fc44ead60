"""The recipe keys of online RL (``train.objective: grpo``): the GRPO family's parameters under ``train.`` with TRL's
names and meanings (``GRPOConfig``), and how rollouts are made under ``rollout.``. Kept apart from ``schema.py``,
which reads them into its ``train`` and ``rollout`` sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bigtrain.config.schema_fields import doc

ImportanceSampling = Literal["token", "sequence"]
ScaleRewards = Literal["group", "batch", "none"]
GRPO_LOSSES = ("grpo", "dr_grpo", "dapo", "bnpo")


@dataclass
class GrpoKeys:
    """``train.`` keys of grpo (TRL 1.16's GRPOConfig names and defaults)."""

    num_generations: int = doc(
        "grpo: completions generated per prompt (a group: advantages compare the completions of one prompt). "
        "train.global_batch_size counts completions and must be a multiple of it.",
        default=8,
    )
    max_completion_length: int = doc("grpo: the most tokens a completion may have (TRL's default).", default=512)
    epsilon: float = doc("grpo: the clip range of the importance ratio, [1 - epsilon, 1 + epsilon_high].", default=0.2)
    epsilon_high: float | None = doc(
        "grpo: the upper clip (DAPO's asymmetric clip, e.g. 0.28); unset: epsilon.", default=None
    )
    num_iterations: int = doc(
        "grpo: optimizer steps on each generated batch (mu in the paper): the first on-policy, the next with the "
        "importance ratio against the generating policy's log-probabilities.",
        default=1,
    )
    importance_sampling_level: ImportanceSampling = doc(
        "grpo: token (a ratio per token) or sequence (GSPO: the mean of the tokens' log-ratios, one per completion).",
        default="token",
    )
    scale_rewards: ScaleRewards = doc(
        "grpo: the advantages' scale: group (reward minus its group's mean, over the group's std), batch (over the "
        "std of the whole batch's rewards) or none (Dr. GRPO: not scaled).",
        default="group",
    )
    temperature: float = doc(
        "grpo: the sampling temperature; log-probabilities are taken of logits / temperature, as TRL does.",
        default=1.0,
    )
    top_p: float = doc("grpo: nucleus sampling's probability mass (1: off).", default=1.0)
    top_k: int = doc("grpo: sample among the k likeliest tokens (0: off).", default=0)
    reward_functions: list[str] = doc(
        "grpo: what scores a completion, each a Python callable by import path, module:function, with TRL's "
        "signature f(prompts, completions, completion_ids, **fields_of_the_record) -> a list of floats (None: not "
        "scored by this function). The module is found on the Python path or in the directory bigtrain starts in; "
        "bigtrain.rewards has exact_answer and answer_first. A local folder of a reward model (a one-output "
        "sequence classifier, model.task reward-model's export) scores prompt + completion with its head, as TRL "
        "does; each rank holds a whole copy.",
        default_factory=list,
    )
    reward_weights: list[float] | None = doc(
        "grpo: the weight of each reward function in the reward (their weighted sum); unset: 1 each.", default=None
    )


@dataclass
class RolloutConfig:
    """The ``rollout`` section: how grpo's completions are generated."""

    engine: Literal["hf", "vllm"] = doc(
        "hf: transformers' generate on the training engine's own model (its current weights, gathered per block "
        "under FSDP2, LoRA applied), with a KV cache. vllm: not built yet.",
        default="hf",
    )
    replay: str | None = doc(
        "A JSON-lines file of completions to train on instead of generating them: line g holds generation g's "
        'completions in the global batch\'s order ({"completion_ids": [[...], ...]}), as a rollout replay for '
        "comparing runs on the same completions.",
        default=None,
    )
    off_policy: int = doc(
        "Steps by which generation may run ahead of training (off-policy rollouts): 0 only, for now.",
        key="async",
        default=0,
    )
    seed: int | None = doc("Seed of the sampling (each generation's own, from it); unset: train.seed.", default=None)
    completions_every: int = doc(
        "Write a table of sample completions (prompt, completion, rewards) to output_dir/completions.jsonl every "
        "this many steps; 0: never.",
        default=0,
    )
