"""A toy objective, as a new engineer would add one (tests/integration/test_a_task_is_one_file.py copies this file
into a copy of the package as ``bigtrain/objectives/mse.py`` and adds its one line to ``RECORDS``): the mean squared
error of one output per example, summed over a micro-batch's examples and normalised by the examples of the whole
global batch (as every bigtrain loss), evaluated as its root (``eval_rmse``). Its loss is the ``Objective`` protocol
of ``bigtrain/losses/base.py``, written here."""

from __future__ import annotations

import math
from typing import Any

from bigtrain.config.setup import EXAMPLES
from bigtrain.objectives.spec import ObjectiveSpec

IGNORE_INDEX = -100  # an evaluation filler's label (``data/labels.py``): counts nothing


class SquaredError:
    per_forward_weight = 0.0
    metric_names: tuple[str, ...] = ()

    def count(self, labels: Any) -> int:
        return int((labels != IGNORE_INDEX).sum())

    def loss_sum(self, output: Any, labels: Any) -> Any:
        kept = (labels != IGNORE_INDEX).float()
        return (((output.squeeze(-1).float() - labels.float()) ** 2) * kept).sum()

    def __call__(self, output: Any, batch: Any) -> Any:
        from bigtrain.losses.base import Terms

        return Terms(self.loss_sum(output.logits, batch.labels))

    def eval_sums(self, output: Any, batch: Any, terms: Any) -> Any:
        import torch

        return torch.zeros(0, device=batch.labels.device)

    def eval_metrics(self, loss: float, sums: Any, count: int) -> dict[str, float]:
        return {"eval_rmse": math.sqrt(max(loss, 0.0)), "eval_examples": count}

    def step_metrics(self, sums: Any, count: int) -> dict[str, float]:
        return {}


OBJECTIVE = ObjectiveSpec(
    name="mse",
    summary="toy mean squared error of one number per example",
    reads=EXAMPLES,
    make=lambda built, train: SquaredError(),
)
