"""``train.objective: dpo`` (Rafailov et al. 2023): on prompt/chosen/rejected pairs, -(1-e) log s(b d) - e log s(-b d)
with d = (c - c0) - (r - r0) the policy's log-probability ratios against the reference model's (``train.loss_type``
sigmoid, ``train.label_smoothing`` e: conservative DPO), or SLiC's hinge max(0, 1 - b d). The reference is a role the
plan places (``parallel.reference``)."""

from __future__ import annotations

from typing import Any

from bigtrain.config.capabilities.reference import ROLE
from bigtrain.config.setup import TOKEN_ROWS
from bigtrain.objectives import pairs
from bigtrain.objectives.spec import ObjectiveSpec


def check(cfg: Any) -> None:
    from bigtrain.roles.reference import check_reference

    pairs.check_numbers(cfg, "dpo", smoothing=True)
    check_reference(cfg)


def attach(engine: Any, options: Any, train: Any) -> None:
    from bigtrain.roles.reference import attach_reference

    attach_reference(engine, options, train)


def before_training(*args: Any) -> None:
    from bigtrain.roles.reference_pass import attach_precomputed

    attach_precomputed(*args)


OBJECTIVE = ObjectiveSpec(
    name="dpo",
    summary="direct preference optimisation on pairs, measured against a reference model",
    reads=TOKEN_ROWS,
    make=pairs.make("dpo_loss", needs_reference=True, averaged=False),
    rows_per_example=pairs.ROWS_PER_PAIR,
    batch_noun="pairs",
    roles=(ROLE,),
    read_data=pairs.read_pairs,
    synthetic=pairs.synthetic_pairs,
    count=pairs.count_pairs,
    check=check,
    attach=attach,
    before_training=before_training,
    keys=(*pairs.KEYS, "train.loss_type", "train.label_smoothing", "parallel.reference"),
    rules=pairs.RULES,
    refusal=pairs.without_log_probabilities("dpo"),
    trl_dpo_loss=lambda train: train.loss_type,
)
