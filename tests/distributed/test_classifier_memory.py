"""The classifier planner's peak is within 10% of bigtrain's own step simulated on fake tensors, median within 5%:
ResNet-50, ConvNeXt-B, ViT-L/16 and BERT-large at real widths (bench/classifier_memory.py's cases); ResNet-50's model
states against a hand count of its published size."""

from __future__ import annotations

import statistics
import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
from classifier_memory import CASES, run_case  # noqa: E402

# CI's case (the full tier): ResNet-50 on DDP, whose model states are also counted by hand below; the rest are the
# extended tier's, as bench/classifier_memory.py prints them all
TIERED = [
    pytest.param(c, id=c.name, marks=pytest.mark.full if i == 0 else pytest.mark.extended) for i, c in enumerate(CASES)
]
_FOUND: dict[str, tuple[int, int]] = {}


def _result(case) -> tuple[int, int]:
    """(predicted, simulated) of a case, simulated on first use (seconds to a minute each)."""
    if case.name not in _FOUND:
        _FOUND[case.name] = run_case(case)
    return _FOUND[case.name]


@pytest.mark.parametrize("case", TIERED)
def test_predicted_peak_within_10_percent_of_the_simulated_step(case):
    predicted, simulated = _result(case)
    assert simulated > 0
    assert abs(predicted / simulated - 1) <= 0.10, f"{case.name}: {predicted / 2**30:.2f} vs {simulated / 2**30:.2f}"


@pytest.mark.extended
def test_median_error_within_5_percent():
    errors = [abs(p / s - 1) for p, s in map(_result, CASES)]
    assert statistics.median(errors) <= 0.05


RESNET_50_PARAMS = 25_557_032  # published (torchvision resnet50 / microsoft/resnet-50 with its 1000-class head)
RESNET_50_TENSORS = 53 + 2 * 53 + 2  # 53 convolutions (4 of them downsampling), a BatchNorm (weight, bias) each, fc


@pytest.mark.full
def test_resnet_50_ddp_holds_the_hand_counted_model_states_predicted_and_simulated():
    """The first case (ResNet-50, DDP, 64 images of 224 px a rank) is activation-bound: 4 GiB of activations beside
    0.4 GB of states, so the 10% comparison cannot see the states. Counted by hand from the published size: fp32
    weights 4 x 25,557,032 bytes, fp32 gradients the same, AdamW's m and v 8 x 25,557,032; the simulated step's
    optimizer state also holds AdamW's fp32 step counter, one per parameter tensor (161)."""
    from classifier_memory import classifier_plan

    from bigtrain.config.workload import Workload
    from bigtrain.job import job_facts
    from bigtrain.measure.simulate import simulate
    from bigtrain.planner.classifier_plan import classifier_model
    from bigtrain.planner.model_stats import load_model_config

    case = CASES[0]
    assert (case.preset, case.backend, case.micro_batch, case.image_size) == ("resnet-50", "ddp", 64, 224)
    config = load_model_config(case.preset)
    plan = classifier_plan(case.backend, case.zero_stage, case.dp, case.micro_batch, case.checkpointed)
    workload = Workload(
        seq_len=1,
        global_batch_size=case.micro_batch * case.dp,
        image_size=case.image_size,
        job=job_facts(task_name="image-classification"),
    )
    predicted = classifier_model(config, workload).estimate_memory(plan, workload)
    psi = RESNET_50_PARAMS
    assert (predicted.params_bytes, predicted.grads_bytes, predicted.optimizer_bytes) == (4 * psi, 4 * psi, 8 * psi)
    simulated = simulate(config, plan, workload)
    assert (simulated["Parameter"], simulated["Gradient"]) == (4 * psi, 4 * psi)
    assert simulated["Optstate"] == 8 * psi + 4 * RESNET_50_TENSORS
    assert abs(predicted.total_bytes / simulated["Total"] - 1) <= 0.10
