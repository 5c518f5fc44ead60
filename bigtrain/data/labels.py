"""What a causal LM is trained to predict: the next token of each position, where that token is a target.

One definition serves the loss (engine) and the token count that normalises it (the loop), so the two can never
disagree about which positions count.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # the label of a position that predicts nothing (HF and torch's cross-entropy convention)


def labelled_positions(labels: torch.Tensor) -> int:
    """How many positions have a label (reads the value: call it on host tensors)."""
    return int((labels != IGNORE_INDEX).sum())


def next_token_labels(input_ids: torch.Tensor) -> torch.Tensor:
    """The target of each position: the next token; the last position of each row predicts nothing (ignored).

    The labels are shifted rather than the logits sliced: slicing would copy the largest tensor of the step
    whenever the micro-batch holds more than one row.
    """
    return F.pad(input_ids[:, 1:], (0, 1), value=IGNORE_INDEX)


def masked_next_token_labels(input_ids: torch.Tensor, targets: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Next-token labels where only tokens marked in ``targets`` (same shape, bool) are predicted: position t
    learns token t+1 only if token t+1 is a target (an assistant or completion token, not a prompt or padding)."""
    targets = torch.as_tensor(targets, dtype=torch.bool)
    labels = next_token_labels(input_ids)
    keep = F.pad(targets[:, 1:], (0, 1), value=False)
    return labels.masked_fill(~keep, IGNORE_INDEX)


def token_logps(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[rows, length] fp32 log-probability of each labelled token (0 where nothing is labelled), under
    softmax(logits / temperature) (grpo samples and scores at its temperature; 1 leaves the logits as they are)."""
    rows, length = labels.shape
    scaled = logits.flatten(0, 1).float()
    if temperature != 1.0:
        scaled = scaled / temperature
    return -F.cross_entropy(scaled, labels.flatten(), reduction="none", ignore_index=IGNORE_INDEX).view(rows, length)
