"""``train.objective: dpo`` (Rafailov et al. 2023): on prompt/chosen/rejected pairs, -(1-e) log s(b d) - e log s(-b d)
with d = (c - c0) - (r - r0) the policy's log-probability ratios against the reference model's (``train.loss_type``
sigmoid, ``train.label_smoothing`` e: conservative DPO), or SLiC's hinge max(0, 1 - b d). The reference is a role the
plan places (``parallel.reference``)."""

from __future__ import annotations

from typing import Any

from bigtrain.objectives import pairs
from bigtrain.objectives.spec import ObjectiveSpec


def check(cfg: Any) -> None:
    from bigtrain.roles.reference import check_reference

    pairs.check_numbers(cfg, "dpo", smoothing=True)
    check_reference(cfg)


OBJECTIVE = ObjectiveSpec(
    name="dpo",
    summary="direct preference optimisation on pairs, measured against a reference model",
    make=pairs.make("dpo_loss", needs_reference=True, averaged=False),
    check=check,
    keys=(*pairs.KEYS, "train.loss_type", "train.label_smoothing", "parallel.reference"),
    trl_dpo_loss=pairs.loss_type_of,
    **pairs.on_pairs("dpo"),
    **pairs.with_reference(),
)
