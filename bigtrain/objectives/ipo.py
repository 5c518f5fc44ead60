"""``train.objective: ipo`` (Azar et al. 2023, length-normalised as TRL's): ((c-c0)/n_c - (r-r0)/n_r - 1/(2b))^2 on
prompt/chosen/rejected pairs, against the reference model (a role the plan places, ``parallel.reference``)."""

from __future__ import annotations

from typing import Any

from bigtrain.objectives import pairs
from bigtrain.objectives.spec import ObjectiveSpec


def check(cfg: Any) -> None:
    from bigtrain.roles.reference import check_reference

    pairs.check_numbers(cfg, "ipo")
    check_reference(cfg)


OBJECTIVE = ObjectiveSpec(
    name="ipo",
    summary="identity preference optimisation on pairs (a squared loss), measured against a reference model",
    make=pairs.make("ipo_loss", needs_reference=True, averaged=False),
    check=check,
    keys=(*pairs.KEYS, "parallel.reference"),
    trl_dpo_loss=lambda train: "ipo",
    **pairs.on_pairs("ipo"),
    **pairs.with_reference(),
)
