"""Mixture-of-experts training with the router's load-balancing loss (Mixtral with ``output_router_logits`` and
``router_aux_loss_coef``): FSDP2 x 2 with accumulation and DeepSpeed ZeRO-3 x 2 equal a single-process loop over the
same micro-batches (loss and gradient norm 1e-5 per step over 10 steps, parameters 2e-5).

The objective, as ``engine/loss.router_loss`` states it: the cross-entropy summed over the global batch's labelled
tokens and divided by their count, plus ``coef`` times the mean of the per-forward router loss over every forward of
the global batch. The router loss is not additive over tokens, so a loop of one forward per global batch is another
objective; the reference runs one forward per micro-batch of one row, as the plans below do (micro_batch_size 1). The
check has teeth: leaving the router loss out moves the first gradient norm far beyond the tolerance."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cases import ROUTED_MIXTRAL
from helpers import learnable_rows, save_rows, save_tiny_model
from test_equivalence import NUM_ROWS, RTOL, SEQ_LEN, STEPS, assert_plan_matches, reference_run

MOE_PLANS = {
    "fsdp2-2ranks-mb1-accum4": (2, dict(backend="fsdp2", micro_batch_size=1)),
    "deepspeed-zero3-2ranks-mb1-accum4": (2, dict(backend="deepspeed", zero_stage=3, micro_batch_size=1)),
}


def routed_reference(model_dir, rows, coef: float, steps: int = STEPS):
    """The plain loop with one forward per row (the plans' micro-batches) and the objective of the module
    docstring."""

    def objective(model, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        labelled = batch[:, 1:].numel()
        forwards = [model(input_ids=row[None]) for row in batch]
        ce = sum(
            F.cross_entropy(f.logits[0, :-1], row[1:], reduction="sum") for f, row in zip(forwards, batch, strict=True)
        )
        router = sum(f.aux_loss for f in forwards) / len(forwards)
        return ce / labelled + coef * router, (ce / labelled).detach()

    return reference_run(model_dir, rows, objective=objective, steps=steps)


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    rows = learnable_rows(NUM_ROWS, SEQ_LEN)
    save_rows(root / "rows.npy", rows)
    model_dir = save_tiny_model(root / "mixtral", spec=ROUTED_MIXTRAL)
    return root / "rows.npy", rows, model_dir, *routed_reference(model_dir, rows, ROUTED_MIXTRAL["router_aux_loss_coef"])


@pytest.mark.parametrize("name", list(MOE_PLANS))
def test_moe_with_its_router_loss_matches_the_single_process_loop(name, routed, tmp_path):
    rows_path, _, model_dir, reference, reference_params = routed
    nproc, parallel = MOE_PLANS[name]
    assert_plan_matches(model_dir, rows_path, nproc, parallel, reference, reference_params, tmp_path)


def test_leaving_the_router_loss_out_would_be_caught(routed):
    _, rows, model_dir, reference, _ = routed
    without, _ = routed_reference(model_dir, rows, coef=0.0, steps=1)
    assert abs(without[0]["grad_norm"] / reference[0]["grad_norm"] - 1) > 10 * RTOL
