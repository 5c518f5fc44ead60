"""``train.objective: classification``: cross-entropy summed over the examples of a micro-batch (one label each, with
``train.label_smoothing``), normalised by the examples of the whole global batch (``losses/classification.py``);
evaluated as accuracy, top-5 accuracy and macro-F1. The objective of image and sequence classifiers."""

from __future__ import annotations

from typing import Any

from bigtrain.config.setup import EXAMPLES
from bigtrain.objectives.spec import ObjectiveSpec


def make(built: Any, train: Any) -> Any:
    from bigtrain.losses.classification import Classification

    return Classification(train.label_smoothing)


OBJECTIVE = ObjectiveSpec(
    name="classification",
    summary="cross-entropy over examples with one label each (label smoothing), accuracy and macro-F1",
    reads=EXAMPLES,
    make=make,
    keys=("train.label_smoothing",),
    refusal=lambda task: (
        f"train.objective=classification trains examples with one label each, which a {task} model does not give; "
        "leave train.objective=auto (its own loss)"
    ),
)
