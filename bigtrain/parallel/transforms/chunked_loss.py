"""Chunked loss (``parallel.loss_chunk_tokens``): the LM head leaves the model's forward and the loss applies it to
chunks of tokens, so the logits of a whole micro-batch never exist at once.

The head module is put inside a pass-through module in its slot: the HF forward then returns the final hidden
states as its "logits", and ``BuiltModel.loss_head`` hands the head to the objective (``losses/causal_lm.py``),
which computes each chunk's logits and cross-entropy under activation checkpointing: backward recomputes one chunk's
logits at a time. The head stays where it was in the module tree, so FSDP2 shards it with the root unit, a tied
embedding stays tied, and DeepSpeed ZeRO-3 gathers it when the loss calls it. Placed after the pipeline split (only
the last stage has a head) and before anything wraps or shards the model. ``rename`` takes the pass-through's
prefix out of the head's names.
"""

from __future__ import annotations

from torch import nn

from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform

INNER = "chunked_head"  # the pass-through's attribute holding the head: ``lm_head.chunked_head.weight``


class HeadInLoss(nn.Module):
    """Stands in the LM head's slot: forward returns the hidden states; the loss calls ``chunked_head``."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.chunked_head = head

    def forward(self, hidden):  # noqa: ANN001, ANN201 - the head's own signature
        # a copy, not the view HF slices out of the final norm's output: FSDP2 hooks the root's output for backward
        # and warns that an in-place op on a view would drop that hook
        return hidden.clone()


def _move_head_to_loss(built: BuiltModel, ctx: BuildContext) -> None:
    for part in built.parts:
        head = part.get_output_embeddings()
        if not isinstance(head, nn.Linear):  # an inner pipeline stage (its "head" is an identity)
            continue
        slot = next(name for name, child in part.named_children() if child is head)
        setattr(part, slot, HeadInLoss(head))
        built.loss_head = head


def hf_name(name: str) -> str:
    return name.replace(f".{INNER}.", ".")


TRANSFORM = Transform(
    name="chunked_loss",
    wanted=lambda options: options.plan.loss_chunk_tokens > 0,
    apply=_move_head_to_loss,
    rename=hf_name,
    planner_terms=("memory_terms.logits_bytes", "cost.estimate_time"),
)
