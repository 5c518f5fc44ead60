"""``train.objective: ipo`` (Azar et al. 2023, length-normalised as TRL's): ((c-c0)/n_c - (r-r0)/n_r - 1/(2b))^2 on
prompt/chosen/rejected pairs, against the reference model (a role the plan places, ``parallel.reference``)."""

from __future__ import annotations

from typing import Any

from bigtrain.config.capabilities.reference import ROLE
from bigtrain.config.setup import TOKEN_ROWS
from bigtrain.objectives import pairs
from bigtrain.objectives.dpo import attach, before_training
from bigtrain.objectives.spec import ObjectiveSpec


def check(cfg: Any) -> None:
    from bigtrain.roles.reference import check_reference

    pairs.check_numbers(cfg, "ipo")
    check_reference(cfg)


OBJECTIVE = ObjectiveSpec(
    name="ipo",
    summary="identity preference optimisation on pairs (a squared loss), measured against a reference model",
    reads=TOKEN_ROWS,
    make=pairs.make("ipo_loss", needs_reference=True, averaged=False),
    rows_per_example=pairs.ROWS_PER_PAIR,
    batch_noun="pairs",
    roles=(ROLE,),
    read_data=pairs.read_pairs,
    synthetic=pairs.synthetic_pairs,
    count=pairs.count_pairs,
    check=check,
    attach=attach,
    before_training=before_training,
    keys=(*pairs.KEYS, "parallel.reference"),
    rules=pairs.RULES,
    refusal=pairs.without_log_probabilities("ipo"),
    trl_dpo_loss=lambda train: "ipo",
)
