"""train.compile compiles the loss too (losses/causal_lm.py): the same value and gradient as the eager loss."""

from __future__ import annotations

import torch

from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.losses.causal_lm import compiled_labeled_loss_sum, labeled_loss_sum


def test_compiled_loss_equals_the_eager_loss_and_its_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 64, (2, 16))
    labels[0, :3] = IGNORE_INDEX  # masked positions count nothing in either
    eager = labeled_loss_sum(logits, labels)
    (eager_grad,) = torch.autograd.grad(eager, logits)
    compiled = compiled_labeled_loss_sum(logits, labels)
    (compiled_grad,) = torch.autograd.grad(compiled, logits)
    assert compiled.dtype == torch.float32
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(compiled_grad, eager_grad)
    assert compiled_grad[0, :3].abs().sum() == 0


def test_compiled_answer_log_probabilities_equal_the_eager_ones_and_their_gradient():
    """The preference objectives' per-row log-probabilities under train.compile (losses/preference.py)."""
    from bigtrain.losses.preference import compiled_sequence_logps, sequence_logps

    torch.manual_seed(0)
    logits = torch.randn(4, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 64, (4, 16))
    labels[:, :5] = IGNORE_INDEX  # the prompt
    (eager, counts), (compiled, compiled_counts) = (
        sequence_logps(logits, labels),
        compiled_sequence_logps(logits, labels),
    )
    (eager_grad,) = torch.autograd.grad(eager.sum(), logits)
    (compiled_grad,) = torch.autograd.grad(compiled.sum(), logits)
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(compiled_grad, eager_grad)
    assert torch.equal(counts, compiled_counts) and counts.tolist() == [11] * 4
