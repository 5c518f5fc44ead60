"""``train.objective: simpo`` (Meng et al. 2024): -log s(b (c/n_c - r/n_r) - gamma) of the answers' mean
log-probabilities (``train.simpo_gamma``); reference-free."""

from __future__ import annotations

from bigtrain.objectives import pairs
from bigtrain.objectives.spec import ObjectiveSpec

OBJECTIVE = ObjectiveSpec(
    name="simpo",
    summary="simple preference optimisation on pairs: a length-normalised margin with a target gap, reference-free",
    make=pairs.make("simpo_loss", needs_reference=False, averaged=True),
    check=lambda cfg: pairs.check_numbers(cfg, "simpo"),
    keys=(*pairs.KEYS, "train.simpo_gamma"),
    **pairs.on_pairs("simpo"),
)
