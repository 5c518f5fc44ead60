"""What the preference objectives share (dpo, ipo, orpo, simpo): prompt/chosen/rejected pairs as data (a pair: its
two answers as two rows of a micro-batch), their loss's machinery (``losses/preference.py``), their numbers, and the
rows of what runs together for objectives that compare whole answers on one rank. dpo and ipo add the reference
model as a role (``config/capabilities/reference.py``, ``roles/reference.py``)."""

from __future__ import annotations

from typing import Any

from bigtrain.config.capabilities.reference import ROLE
from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.capabilities.table import row, split_settings
from bigtrain.config.setup import TOKEN_ROWS, Setup
from bigtrain.errors import ConfigError

ROWS_PER_PAIR = 2  # its chosen and its rejected answer, each a row of its own (``data/batch.PairBatch``)
BETA = 0.1  # TRL's DPOConfig/ORPOConfig/CPOConfig beta, where train.beta is unset
DPO_LOSSES = ("sigmoid", "hinge")
KEYS = ("train.beta", "data.max_prompt_length", "data.prompt_field", "data.chosen_field", "data.rejected_field")


def read_pairs(cfg: Any, hf_config: Any) -> tuple[Any, Any]:
    """Pairs of ``data.path`` (text or chat records) and the held-out ones, tokenised by the recipe's tokenizer."""
    from bigtrain.data.preference import read_pairs_and_held_out

    return read_pairs_and_held_out(cfg, hf_config)


def make(pair_loss: str, needs_reference: bool, averaged: bool) -> Any:
    """The ``make`` of a preference objective whose per-pair loss is ``losses.preference.<pair_loss>``."""

    def made(built: Any, train: Any) -> Any:
        from bigtrain.losses import preference
        from bigtrain.losses.causal_lm import router_loss_coef

        settings = preference.PreferenceSettings(
            getattr(preference, pair_loss),
            needs_reference,
            averaged,
            beta_of(train),
            loss_type_of(train),
            train.label_smoothing,
            train.simpo_gamma,
        )
        return preference.Preference(settings, router_loss_coef(built.parts[0].config), built.compile_loss)

    return made


def beta_of(train: Any) -> float:
    """train.beta, or TRL's default for the preference objectives where it is unset."""
    return BETA if train.beta is None else train.beta


def loss_type_of(train: Any) -> str:
    """train.loss_type, or dpo's default (TRL's sigmoid) where it is unset."""
    return DPO_LOSSES[0] if train.loss_type is None else train.loss_type


def check_numbers(cfg: Any, objective: str, smoothing: bool = False) -> None:
    """beta must train something; the loss type one of dpo's; label smoothing only where the objective has it
    (dpo's sigmoid: conservative DPO) and below 0.5 (above, most preferences flip)."""
    train = cfg.train
    if beta_of(train) == 0:
        raise ConfigError(f"train.beta=0 with train.objective={objective} trains nothing; use e.g. 0.1")
    if train.loss_type is not None and train.loss_type not in DPO_LOSSES:
        raise ConfigError(
            f"train.loss_type={train.loss_type} is grpo's; train.objective={objective} takes "
            f"{' or '.join(DPO_LOSSES)} (dpo) or none"
        )
    if train.label_smoothing and not (smoothing and loss_type_of(train) == "sigmoid"):
        raise ConfigError(
            f"train.label_smoothing={train.label_smoothing} applies to dpo with loss_type sigmoid (conservative DPO); "
            f"train.objective={objective} has none: set train.label_smoothing=0"
        )
    if train.label_smoothing >= 0.5:
        raise ConfigError(
            f"train.label_smoothing={train.label_smoothing} would flip most preferences; use [0, 0.5), e.g. 0.1"
        )


def synthetic_pairs(hf_config: Any, plan: Any, workload: Any, device: Any) -> Any:
    """A micro-batch as the data path makes it: 2m rows (chosen, then rejected) of the workload's length, the first
    half of each row its prompt; the reference's log-probabilities with it where they are precomputed."""
    import torch

    from bigtrain.config.capabilities.reference import reference_mode
    from bigtrain.data.batch import PairBatch
    from bigtrain.data.labels import IGNORE_INDEX, next_token_labels

    rows, length = ROWS_PER_PAIR * plan.micro_batch_size, workload.seq_len
    ids = torch.randint(0, hf_config.vocab_size, (rows, length), device=device)
    labels = next_token_labels(ids)
    labels[:, : length // 2] = IGNORE_INDEX
    precomputed = reference_mode(plan, workload) == "precomputed"
    return PairBatch(ids, labels, torch.zeros(rows, device=device) if precomputed else None)


def count_pairs(batch: Any, workload: Any, plan: Any) -> float:
    """A global batch counts its pairs."""
    return float(workload.global_batch_size)


def preference_with_model_parallelism(s: Setup) -> str | None:
    """The objective compares whole answers of a pair on one rank: what splits a row, the vocabulary or the layers,
    and replica groups that train apart, are not built with it."""
    assert s.job is not None
    settings = (*split_settings(s.plan), ("sync", settings_of(s.plan).mode, "every_step"))
    for key, value, default in settings:
        if value != default:
            return (
                f"parallel.{key}={str(value).lower()} with train.objective={s.job.objective} is not built yet "
                f"(the objective compares whole answers of a pair on one rank); set parallel.{key}="
                f"{str(default).lower()} and shard with FSDP2 or DeepSpeed ZeRO-3"
            )
    return None


def without_log_probabilities(objective: str) -> Any:
    """What a preference objective on a model without log-probabilities of token rows is told."""
    return lambda task: (
        f"train.objective={objective} compares the log-probabilities of two answers, which a {task} model does not "
        "give; use a causal LM, or train.objective=auto (the model's own loss)"
    )


RULES = (row(preference_with_model_parallelism, "not_built", reads_job=True),)


def on_pairs(objective: str) -> dict[str, Any]:
    """The spec fields every objective on pairs shares: it reads token rows; its data are pairs, two rows each, and
    the global batch counts pairs; its rows; its refusal of a model without log-probabilities."""
    return dict(
        reads=TOKEN_ROWS,
        rows_per_example=ROWS_PER_PAIR,
        batch_noun="pairs",
        shown=("rewards/accuracies", "rewards/margins"),
        read_data=read_pairs,
        synthetic=synthetic_pairs,
        count=count_pairs,
        rules=RULES,
        refusal=without_log_probabilities(objective),
    )


def attach_reference(engine: Any, options: Any, train: Any) -> None:
    from bigtrain.roles.reference import attach_reference as attach

    attach(engine, options, train)


def precompute_reference(*args: Any) -> None:
    from bigtrain.roles.reference_pass import attach_precomputed

    attach_precomputed(*args)


def with_reference() -> dict[str, Any]:
    """The spec fields of an objective measured against a reference model: the role the plan places
    (``parallel.reference``), attached to the engine once it is built, or its log-probabilities computed in a pass
    before the first step."""
    return dict(roles=(ROLE,), attach=attach_reference, before_training=precompute_reference)
