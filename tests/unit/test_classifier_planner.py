"""Classifiers through the one planner (``planner/search.py`` with a classifier's ``PlannedModel``:
``planner/classifier_stats.py`` measures the model, ``classifier_plan.py`` holds its terms): what it measures of a
model against published figures, the plan it chooses and why, the scaling from 1 GPU, and what it refuses."""

from __future__ import annotations

import pytest
from helpers import make_plan

import bigtrain
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.job import job_facts
from bigtrain.planner.auto import choose_plan
from bigtrain.planner.classifier_plan import classifier_model, estimate_memory, estimate_time
from bigtrain.planner.classifier_stats import measure_classifier
from bigtrain.planner.hardware import GiB, make_cluster
from bigtrain.planner.model_stats import load_model_config

IMAGES, TEXTS = job_facts(task_name="image-classification"), job_facts(task_name="sequence-classification")
# the published checkpoints' parameters, with the heads the presets carry (1000 ImageNet classes, 2 text labels)
EXACT = {
    "resnet-50": 25_557_032,
    "convnext-base": 88_591_464,
    "vit-base": 86_567_656,
    "vit-large": 304_326_632,
    "bert-base": 109_482_240 + 1_538,
    "bert-large": 335_141_888 + 2_050,
}
# forward multiply-accumulates per 224 px image, from torchvision's model cards
TORCHVISION_GMACS = {"resnet-50": 4.089, "convnext-base": 15.355, "vit-base": 17.564, "vit-large": 61.555}


def _stats(preset: str, image_size: int = 224, seq_len: int = 0):
    text = "bert" in preset
    task, unit = ("sequence-classification", "examples") if text else ("image-classification", "images")
    size = 0 if text else image_size
    return measure_classifier(load_model_config(preset), size, seq_len or 128 * text, "bf16", task, unit, "full")


def ddp(dp: int, micro: int, checkpointed: bool = False):
    return make_plan(
        backend="ddp", zero_stage=0, dp_replicate=dp, grad_reduce="once_per_step", micro_batch_size=micro,
        activation_checkpointing="full" if checkpointed else "none",
    )  # fmt: skip


@pytest.mark.parametrize("preset", sorted(EXACT))
def test_the_planner_s_own_count_is_the_published_one(preset):
    assert _stats(preset).params == EXACT[preset]


@pytest.mark.parametrize("preset", sorted(TORCHVISION_GMACS))
def test_training_flops_per_image_are_three_published_forwards(preset):
    """ViT-B/16 by hand: patch embedding 196x768x768; per block qkv 197x768x2304, scores and weighted sum
    2x197^2x768, projection 197x768^2, MLP 2x197x768x3072: 17.56 GMACs with the head, 0.72 of them attention's two
    matmuls (which torch's FLOP counter does not see in the CPU attention kernel: classifier_stats counts them)."""
    assert _stats(preset).flops_per_example == pytest.approx(3 * 2 * TORCHVISION_GMACS[preset] * 1e9, rel=0.01)


def test_activations_grow_with_the_image():
    resnet = _stats("resnet-50")
    assert resnet.convolutional and resnet.batch_norm
    large = _stats("resnet-50", image_size=320)
    assert dict(large.per_example)["cast"] > 1.8 * dict(resnet.per_example)["cast"]
    # autocast keeps a compute-dtype copy of every weight for backward: a fixed term the cast weights do not have
    assert dict(resnet.fixed)["autocast"] > 1.5 * resnet.params > dict(resnet.fixed)["cast"]


@pytest.mark.full  # two ResNet-50 steps simulated on fake tensors (~25 s)
def test_activations_grow_per_image_as_the_simulated_step_s():
    from bigtrain.measure.simulate import simulate

    config, stats = load_model_config("resnet-50"), _stats("resnet-50")
    predicted, simulated = [], []
    for mb in (64, 256):
        plan, workload = ddp(2, mb), Workload(seq_len=1, global_batch_size=2 * mb, image_size=224, job=IMAGES)
        predicted.append(estimate_memory(stats, plan, workload).activations_bytes)
        simulated.append(simulate(config, plan, workload)["Activation"])
    assert (predicted[1] - predicted[0]) == pytest.approx(simulated[1] - simulated[0], rel=0.03)


def test_sharding_is_chosen_when_a_replica_does_not_fit():
    result = bigtrain.plan("vit-large", gpus=8, gpu="H100", gpu_memory="6GB", global_batch_size=256)
    assert result.fits and result.plan.backend != "ddp"
    assert not any(c.fits for c in result.searched if c.plan.backend == "ddp")
    assert "img/s/dev" in result.explain()


def test_a_replica_that_fits_trains_with_ddp_and_the_table_scales_from_one_gpu():
    result = bigtrain.plan("resnet-50", gpus=8, gpu="A100-80GB", image_size=224, global_batch_size=2048)
    assert result.plan.backend == "ddp" and result.plan.dp == 8 and result.micro_batch_size == 256
    rows = result.scaling()
    assert [r.gpus for r in rows] == [1, 2, 4, 8]
    assert rows[0].speedup == 1.0 and rows[0].exposed_s == 0
    assert all(0.9 < r.efficiency <= 1.0 for r in rows) and rows[-1].speedup > 7
    text = result.explain()
    assert "speed-up" in text and "images/s" in text and "scaling of this plan, 256 images per GPU" in text
    assert "not modelled: the input pipeline" in text  # what its efficiency leaves out, said under the table


@pytest.mark.full  # BERT-large measured on fake tensors (~5 s)
def test_traffic_across_nodes_stops_hiding_behind_backward():
    """BERT-large's 1.3 GB of fp32 gradients over L4s' PCIe (32 GB/s) outlast backward from 4 GPUs on, and over
    12.5 GB/s Ethernet between two nodes far more: the table says from which count on."""
    result = bigtrain.plan("bert-large", gpus=16, gpu="L4", seq_len=128, global_batch_size=256, fix={"backend": "ddp"})
    rows = {r.gpus: r for r in result.scaling()}
    assert rows[16].exposed_s > 3 * rows[8].exposed_s and rows[16].efficiency < 0.6 * rows[8].efficiency
    assert "below 90% efficiency" in result.explain()


def test_small_micro_batches_pay_the_operator_floor():
    stats, cluster = _stats("resnet-50"), make_cluster(8, gpu_name="A100-80GB")
    workload = Workload(seq_len=1, global_batch_size=2048, image_size=224, job=IMAGES)
    small = estimate_time(stats, ddp(8, 2), cluster, workload)
    large = estimate_time(stats, ddp(8, 256), cluster, workload)
    assert small.step_s > 1.5 * large.step_s


def test_plan_auto_chooses_for_a_classifier_on_the_job_s_devices():
    config = load_model_config(
        {"model_type": "resnet", "architectures": ["ResNetForImageClassification"], "embedding_size": 8,
         "hidden_sizes": [8, 16], "depths": [1, 1], "layer_type": "basic", "num_labels": 10}
    )  # fmt: skip
    workload = Workload(seq_len=1, global_batch_size=32, image_size=32, mixed_precision="fp32", job=IMAGES)
    model = classifier_model(config, workload)
    choice = choose_plan(model, 2, 2, None, 8 * GiB, workload)
    assert choice.plan.dp == 2 and choice.method == "full" and "img/s/dev" in choice.table
    with pytest.raises(ConfigError, match="found no plan the trainer can run"):
        choose_plan(model, 2, 2, None, GiB // 64, workload)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "resnet-50", "gpus": 3, "global_batch_size": 100}, "global_batch_size=100 does not divide over 3"),
        ({"model": "resnet-50", "gpus": 2, "method": "lora"}, "resnet has no linear layer in its blocks"),
        ({"model": "vit-base", "gpus": 2, "method": "qlora"}, "train.method=qlora with model.task=image-classif"),
        ({"model": "bert-base", "gpus": 2, "image_size": 224}, "image_size is for image models"),
        ({"model": "llama-3-8b", "gpus": 2, "image_size": 224}, "image_size is for image classifiers"),
        ({"model": "bert-base", "gpus": 2, "seq_len": 1024}, "more than the model's 512 positions"),
        ({"model": "resnet-50", "gpus": 2, "objective": "dpo"}, "which a image-classification model does not give"),
    ],
)
def test_bad_input_is_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        bigtrain.plan(kwargs.pop("model"), gpu="H100", **kwargs)


@pytest.mark.full  # BERT-large at 512 tokens measured on fake tensors (~12 s)
def test_checkpointing_is_weighed_where_it_applies():
    """BERT-large at 512 tokens on 9 GB GPUs: without checkpointing only tiny micro-batches fit, whose operator
    launches cost more than checkpointing's third more compute at a larger one; ResNet's BatchNorm would update its
    statistics twice on recompute (the batch_norm record's row), so no ResNet plan checkpoints."""
    bert = bigtrain.plan("bert-large", gpus=8, gpu="L4", gpu_memory="9GB", seq_len=512, global_batch_size=256)
    assert bert.fits and bert.plan.activation_checkpointing == "full"
    plain = [c for c in bert.searched if c.plan.activation_checkpointing == "none" and c.runnable]
    fitting = [c for c in plain if c.fits]
    assert fitting and max(c.plan.micro_batch_size for c in fitting) < bert.micro_batch_size
    assert min(c.time.step_s for c in fitting) > bert.time.step_s
    resnet = bigtrain.plan("resnet-50", gpus=8, gpu="L4", global_batch_size=256)
    assert all(c.plan.activation_checkpointing == "none" for c in resnet.searched if c.runnable)


def test_lora_on_vit_large_trains_the_hand_counted_adapters_and_head():
    """r=16 on q, k, v, o (16 x (1024 + 1024) each) and fc1, fc2 (16 x (1024 + 4096) each): 294,912 a block x 24 =
    7,077,888, and the 1000-class head 1,025,000: 8,102,888 ("8.10M"), beside a bf16 base."""
    lora = bigtrain.plan("vit-large", gpus=8, gpu="L4", global_batch_size=256, fix={"backend": "ddp"}, method="lora")
    assert lora.model.lora_params(16) == 24 * (4 * 16 * 2048 + 2 * 16 * 5120) + 1024 * 1000 + 1000 == 8_102_888
    full = bigtrain.plan("vit-large", gpus=8, gpu="L4", global_batch_size=256, fix={"backend": "ddp"})
    same = next(c for c in full.searched if c.plan == lora.plan)
    assert lora.memory.params_bytes < same.memory.params_bytes / 1.9
    assert lora.memory.optimizer_bytes == 8 * 8_102_888  # AdamW's two fp32 states of what trains
    assert "LoRA r=16: 8.10M trained" in lora.explain()


def test_a_classifier_plans_as_an_lm_does_one_result_with_every_conversion():
    """One PlanResult for every task: the recipe and HF Trainer arguments of a classifier's plan, and its JSON."""
    result = bigtrain.plan("vit-base", gpus=2, gpu="A100-80GB", global_batch_size=64)
    recipe = result.to_recipe()
    assert recipe["parallel"]["micro_batch_size"] == result.micro_batch_size and recipe["data"]["image_size"] == 224
    assert result.to_dict()["scaling"][0]["gpus"] == 1 and result.to_dict()["model"]["task"] == "image-classification"
