"""The classification objective: cross-entropy *summed* over the examples of a micro-batch, which the engine scales
by 1 / (labelled examples of the whole global batch), so that accumulation and data parallelism train exactly what
one forward over the global batch with the mean loss trains (``losses/causal_lm.py`` says why a sum).
An evaluation filler (label IGNORE_INDEX) adds nothing to the sum or the count."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from bigtrain.data.labels import IGNORE_INDEX, labelled_positions
from bigtrain.losses.base import NoStepMetrics, Terms


class Classification(NoStepMetrics):
    """One label per example; ``label_smoothing`` as torch's cross-entropy takes it."""

    per_forward_weight = 0.0

    def __init__(self, label_smoothing: float = 0.0) -> None:
        self.label_smoothing = label_smoothing

    def count(self, labels: torch.Tensor) -> int:
        return labelled_positions(labels)  # an example each

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            logits.float(), labels, reduction="sum", ignore_index=IGNORE_INDEX, label_smoothing=self.label_smoothing
        )

    def __call__(self, output: Any, batch: Any) -> Terms:
        return Terms(self.loss_sum(output.logits, batch.labels))

    def eval_sums(self, output: Any, batch: Any, terms: Terms) -> torch.Tensor:
        """[top-1 correct, top-5 correct, then per class: true positives, predicted, actual] of the labelled
        examples: accuracy, top-5 accuracy and macro-F1 over the whole held-out set come from their sums."""
        labels = batch.labels
        logits = output.logits.float()
        classes = logits.shape[-1]
        kept = labels != IGNORE_INDEX
        target = labels.clamp(min=0)
        best = logits.topk(min(5, classes), dim=-1).indices
        top1 = best[:, 0]
        correct = ((top1 == target) & kept).sum()
        correct5 = ((best == target[:, None]).any(-1) & kept).sum()
        one_hot = torch.nn.functional.one_hot
        predicted = (one_hot(top1, classes) * kept[:, None]).sum(0)
        actual = (one_hot(target, classes) * kept[:, None]).sum(0)
        hits = (one_hot(target, classes) * (top1 == target)[:, None] * kept[:, None]).sum(0)
        return torch.cat([correct.reshape(1), correct5.reshape(1), hits, predicted, actual]).float()

    def eval_metrics(self, loss: float, sums: torch.Tensor, count: int) -> dict[str, float]:
        classes = (len(sums) - 2) // 3
        hits, predicted, actual = sums[2:].view(3, classes)
        seen = (predicted + actual) > 0  # macro-F1 over the classes that occur in the labels or the predictions
        f1 = (2 * hits[seen] / (predicted[seen] + actual[seen])).mean() if seen.any() else torch.tensor(0.0)
        out = {"eval_accuracy": float(sums[0]) / max(count, 1)}
        if classes >= 5:
            out["eval_top5_accuracy"] = float(sums[1]) / max(count, 1)
        return {**out, "eval_macro_f1": float(f1), "eval_examples": count}
