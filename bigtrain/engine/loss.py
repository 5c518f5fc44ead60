"""The training loss: the *sum* of next-token cross-entropies over the labelled positions, which the engine scales
by 1 / (labelled positions of the whole global batch).

Why a sum and a global count: the mean over micro-batches of per-micro-batch means weights a token by the size of
its micro-batch; dividing every token's loss by the same global count makes the gradient exactly that of one forward
over the whole global batch, for any split into ranks and micro-steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bigtrain.data.labels import IGNORE_INDEX


def labeled_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of cross-entropy against ``labels`` (already shifted; IGNORE_INDEX where nothing is predicted),
    in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=IGNORE_INDEX)
