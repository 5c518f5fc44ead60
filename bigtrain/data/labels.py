"""What a causal LM is trained to predict: the next token of each position.

One definition serves the loss (engine) and the token count that normalises it (the loop), so the two can never
disagree about which positions count.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # the label of a position that predicts nothing (HF and torch's cross-entropy convention)


def next_token_labels(input_ids: torch.Tensor) -> torch.Tensor:
    """The target of each position: the next token; the last position of each row predicts nothing (ignored).

    The labels are shifted rather than the logits sliced: slicing would copy the largest tensor of the step
    whenever the micro-batch holds more than one row.
    """
    return F.pad(input_ids[:, 1:], (0, 1), value=IGNORE_INDEX)


def predicted_tokens(input_ids: torch.Tensor) -> int:
    """How many next-token targets a batch has (call it on host tensors: it reads the value)."""
    return int((next_token_labels(input_ids) != IGNORE_INDEX).sum())
