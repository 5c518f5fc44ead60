"""``train.objective: simpo`` (Meng et al. 2024): -log s(b (c/n_c - r/n_r) - gamma) of the answers' mean
log-probabilities (``train.simpo_gamma``); reference-free."""

from __future__ import annotations

from bigtrain.config.setup import TOKEN_ROWS
from bigtrain.objectives import pairs
from bigtrain.objectives.spec import ObjectiveSpec

OBJECTIVE = ObjectiveSpec(
    name="simpo",
    summary="simple preference optimisation on pairs: a length-normalised margin with a target gap, reference-free",
    reads=TOKEN_ROWS,
    make=pairs.make("simpo_loss", needs_reference=False, averaged=True),
    rows_per_example=pairs.ROWS_PER_PAIR,
    batch_noun="pairs",
    read_data=pairs.read_pairs,
    synthetic=pairs.synthetic_pairs,
    count=pairs.count_pairs,
    check=lambda cfg: pairs.check_numbers(cfg, "simpo"),
    keys=(*pairs.KEYS, "train.simpo_gamma"),
    rules=pairs.RULES,
    refusal=pairs.without_log_probabilities("simpo"),
)
