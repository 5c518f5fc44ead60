"""``train.objective: orpo`` (Hong et al. 2024): the chosen answer's mean NLL plus b times -log s of the log odds
ratio of the mean log-probabilities, odds(p) = e^p / (1 - e^p); reference-free."""

from __future__ import annotations

from bigtrain.objectives import pairs
from bigtrain.objectives.spec import ObjectiveSpec

OBJECTIVE = ObjectiveSpec(
    name="orpo",
    summary="odds-ratio preference optimisation on pairs: supervised and preference loss in one, reference-free",
    make=pairs.make("orpo_loss", needs_reference=False, averaged=True),
    check=lambda cfg: pairs.check_numbers(cfg, "orpo"),
    keys=pairs.KEYS,
    **pairs.on_pairs("orpo"),
)
