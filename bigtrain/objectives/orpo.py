"""``train.objective: orpo`` (Hong et al. 2024): the chosen answer's mean NLL plus b times -log s of the log odds
ratio of the mean log-probabilities, odds(p) = e^p / (1 - e^p); reference-free."""

from __future__ import annotations

from bigtrain.config.setup import TOKEN_ROWS
from bigtrain.objectives import pairs
from bigtrain.objectives.spec import ObjectiveSpec

OBJECTIVE = ObjectiveSpec(
    name="orpo",
    summary="odds-ratio preference optimisation on pairs: supervised and preference loss in one, reference-free",
    reads=TOKEN_ROWS,
    make=pairs.make("orpo_loss", needs_reference=False, averaged=True),
    rows_per_example=pairs.ROWS_PER_PAIR,
    batch_noun="pairs",
    read_data=pairs.read_pairs,
    synthetic=pairs.synthetic_pairs,
    count=pairs.count_pairs,
    check=lambda cfg: pairs.check_numbers(cfg, "orpo"),
    keys=pairs.KEYS,
    rules=pairs.RULES,
    refusal=pairs.without_log_probabilities("orpo"),
)
