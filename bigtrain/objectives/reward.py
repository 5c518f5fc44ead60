"""``train.objective: reward``: a reward model's Bradley-Terry loss on prompt/chosen/rejected pairs (the pairs DPO
reads), each answer scored by the model's one-output head, the chosen and the rejected answers of a micro-batch in
one forward (``losses/reward.py``), with TRL's optional per-pair ``margin`` and ``center_rewards_coefficient``;
evaluated as the accuracy and margin on held-out pairs. The objective of ``model.task: reward-model``."""

from __future__ import annotations

from typing import Any

from bigtrain.config.setup import SCORES
from bigtrain.errors import ConfigError
from bigtrain.objectives.pairs import ROWS_PER_PAIR, count_pairs
from bigtrain.objectives.spec import ObjectiveSpec


def make(built: Any, train: Any) -> Any:
    from bigtrain.losses.reward import BradleyTerry

    return BradleyTerry(train.center_rewards_coefficient)


def check(cfg: Any) -> None:
    coefficient = cfg.train.center_rewards_coefficient
    if coefficient < 0:
        raise ConfigError(
            f"train.center_rewards_coefficient={coefficient} would push the rewards away from 0; use 0 (off) or a "
            "small positive weight such as 0.01 (TRL's suggestion)"
        )


def read_data(cfg: Any, hf_config: Any) -> tuple[Any, Any]:
    from bigtrain.data.reward_pairs import read_reward_pairs

    return read_reward_pairs(cfg, hf_config)


def synthetic(hf_config: Any, plan: Any, workload: Any, device: Any) -> Any:
    """A micro-batch as the data path makes it: m pairs as 2m rows of the workload's length, unpadded."""
    import torch

    from bigtrain.data.reward_pairs import RewardBatch

    pairs, length = plan.micro_batch_size, workload.seq_len
    ids = torch.randint(0, hf_config.vocab_size, (ROWS_PER_PAIR * pairs, length), device=device)
    zeros = torch.zeros(pairs, device=device)
    return RewardBatch(ids, torch.ones_like(ids), zeros, zeros.long())


OBJECTIVE = ObjectiveSpec(
    name="reward",
    summary="a reward model's Bradley-Terry loss on preference pairs (TRL's margin and reward centring), accuracy",
    reads=SCORES,
    make=make,
    rows_per_example=ROWS_PER_PAIR,
    read_data=read_data,
    synthetic=synthetic,
    count=count_pairs,
    check=check,
    keys=("train.center_rewards_coefficient", "data.max_prompt_length", "data.seq_len"),
    batch_noun="pairs",
    shown=("accuracy", "margin"),
    refusal=lambda task: (
        f"train.objective=reward scores each answer with a one-output head, which a {task} model does not have; use "
        "model.task=reward-model"
    ),
)
