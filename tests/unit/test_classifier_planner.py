"""The classifier planner (planner/classifier_stats.py, classifier_plan.py, api/classifier_planning.py): what it
measures of a model, the plan it chooses and why, the scaling from 1 GPU, and what it refuses."""

from __future__ import annotations

import pytest

import bigtrain
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.planner.auto import choose_plan
from bigtrain.planner.classifier_plan import classifier_plan, estimate_memory, estimate_time
from bigtrain.planner.classifier_stats import measure_classifier
from bigtrain.planner.hardware import GiB, make_cluster
from bigtrain.planner.model_stats import load_model_config

# parameters of the published checkpoints with the heads the presets carry (1000 ImageNet classes, 2 text labels)
PUBLISHED = {
    "resnet-50": 25.56e6,
    "convnext-base": 88.59e6,
    "vit-base": 86.57e6,
    "vit-large": 304.33e6,
    "bert-base": 109.48e6,
    "bert-large": 335.14e6,
    "modernbert-base": 149.6e6,
}


def _stats(preset: str, image_size: int = 224, seq_len: int = 0):
    text = "bert" in preset
    return measure_classifier(load_model_config(preset), 0 if text else image_size, seq_len or 128 * text, "bf16")


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_presets_have_their_published_size(preset):
    """Counted on the meta model the planner measures (its own count is the same sum: classifier_stats.py)."""
    import torch
    import transformers

    from bigtrain.config.hf import model_config_object
    from bigtrain.config.tasks import task_of

    config = model_config_object(load_model_config(preset))
    with torch.device("meta"):
        model = getattr(transformers, task_of(config).auto_class).from_config(config)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(PUBLISHED[preset], rel=0.005)


def test_flops_and_activations_are_measured_per_example():
    resnet = _stats("resnet-50")
    # torchvision's ResNet-50 card: 4.09 GMACs per 224 px image; forward + backward is three forwards
    assert resnet.flops_per_example == pytest.approx(3 * 2 * 4.09e9, rel=0.02)
    assert resnet.convolutional and resnet.batch_norm
    # a larger image holds more activations per example; the FLOPs grow with the pixels
    large = _stats("resnet-50", image_size=320)
    assert dict(large.per_example)["cast"] > 1.8 * dict(resnet.per_example)["cast"]
    assert large.flops_per_example == pytest.approx(resnet.flops_per_example * (320 / 224) ** 2, rel=0.05)
    # autocast keeps a compute-dtype copy of every weight for backward: a fixed term the cast weights do not have
    assert dict(resnet.fixed)["autocast"] > 1.5 * resnet.params > dict(resnet.fixed)["cast"]


def test_sharding_is_chosen_when_a_replica_does_not_fit():
    result = bigtrain.plan("vit-large", gpus=8, gpu="H100", gpu_memory="6GB", global_batch_size=256)
    assert result.fits and result.plan.backend != "ddp"
    assert not any(c.fits for c in result.searched if c.plan.backend == "ddp")
    assert "DDP would not fit" in result.explain()


def test_a_replica_that_fits_trains_with_ddp_and_the_table_scales_from_one_gpu():
    result = bigtrain.plan("resnet-50", gpus=8, gpu="A100-80GB", image_size=224, global_batch_size=2048)
    assert result.plan.backend == "ddp" and result.plan.dp == 8 and result.micro_batch_size == 256
    rows = result.scaling
    assert [r.gpus for r in rows] == [1, 2, 4, 8]
    assert rows[0].speedup == 1.0 and rows[0].comm_s == 0
    assert all(0.9 < r.efficiency <= 1.0 for r in rows) and rows[-1].speedup > 7
    text = result.explain()
    assert "speed-up" in text and "images/s" in text and "scaling of this plan, 256 images per GPU" in text


@pytest.mark.full  # BERT-large measured on fake tensors (~5 s)
def test_traffic_across_nodes_stops_hiding_behind_backward():
    """BERT-large's 1.3 GB of fp32 gradients over L4s' PCIe (32 GB/s) outlast backward from 4 GPUs on, and over
    12.5 GB/s Ethernet between two nodes far more: the table says from which count on."""
    result = bigtrain.plan("bert-large", gpus=16, gpu="L4", seq_len=128, global_batch_size=256, fix={"backend": "ddp"})
    rows = {r.gpus: r for r in result.scaling}
    assert rows[2].exposed_s <= 0.11 * rows[2].comm_s < rows[4].exposed_s
    assert rows[16].exposed_s > 3 * rows[8].exposed_s and rows[16].efficiency < 0.6 * rows[8].efficiency
    assert "from 4 GPUs on, gradient traffic outlasts backward" in result.explain()


def test_small_micro_batches_pay_the_operator_floor():
    stats, cluster = _stats("resnet-50"), make_cluster(8, gpu_name="A100-80GB")
    workload = Workload(seq_len=1, global_batch_size=2048, image_size=224)
    small = estimate_time(stats, classifier_plan("ddp", 0, 8, 2), cluster, workload)
    large = estimate_time(stats, classifier_plan("ddp", 0, 8, 256), cluster, workload)
    assert small.step_s > 1.5 * large.step_s
    # memory grows with the micro-batch by the measured activations per example
    grow = estimate_memory(stats, classifier_plan("ddp", 0, 8, 256), workload).activations_bytes
    assert grow == pytest.approx(dict(stats.fixed)["autocast"] + 256 * dict(stats.per_example)["autocast"], rel=1e-6)


def test_plan_auto_chooses_for_a_classifier_on_the_job_s_devices():
    config = load_model_config(
        {"model_type": "resnet", "architectures": ["ResNetForImageClassification"], "embedding_size": 8,
         "hidden_sizes": [8, 16], "depths": [1, 1], "layer_type": "basic", "num_labels": 10}
    )  # fmt: skip
    workload = Workload(seq_len=1, global_batch_size=32, image_size=32, mixed_precision="fp32")
    choice = choose_plan(config, 2, 2, None, 8 * GiB, workload)
    assert choice.plan.dp == 2 and choice.method == "full" and "images/s" in choice.table
    with pytest.raises(ConfigError, match="found no plan that fits"):
        choose_plan(config, 2, 2, None, GiB, workload)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "resnet-50", "gpus": 3, "global_batch_size": 100}, "global_batch_size=100 does not divide over 3"),
        ({"model": "resnet-50", "gpus": 2, "method": "lora"}, "blocks hold no linear layer"),
        ({"model": "vit-base", "gpus": 2, "method": "qlora"}, "classifiers train with method full or lora"),
        ({"model": "vit-base", "gpus": 2, "compile": True}, "compile=True: the planner plans classifiers"),
        ({"model": "bert-base", "gpus": 2, "image_size": 224}, "image_size is for image models"),
        ({"model": "llama-3-8b", "gpus": 2, "image_size": 224}, "image_size is for image classifiers"),
        ({"model": "bert-base", "gpus": 2, "seq_len": 1024}, "more than the model's 512 positions"),
    ],
)
def test_bad_input_is_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        bigtrain.plan(kwargs.pop("model"), gpu="H100", **kwargs)


@pytest.mark.full  # BERT-large at 512 tokens measured on fake tensors (~12 s)
def test_checkpointing_is_weighed_where_it_applies():
    """BERT-large at 512 tokens on 9 GB GPUs: without checkpointing only tiny micro-batches fit, whose operator
    launches cost more than checkpointing's third more compute at a larger one; ResNet's BatchNorm would update its
    statistics twice on recompute, so no ResNet plan checkpoints."""
    bert = bigtrain.plan("bert-large", gpus=8, gpu="L4", gpu_memory="9GB", seq_len=512, global_batch_size=256)
    assert bert.fits and bert.plan.activation_checkpointing == "full"
    plain = [c for c in bert.searched if c.plan.activation_checkpointing == "none"]
    fitting = [c for c in plain if c.fits]
    assert fitting and max(c.plan.micro_batch_size for c in fitting) < bert.micro_batch_size
    assert min(c.time.step_s for c in fitting) > bert.time.step_s
    same = next(c for c in plain if c.plan.micro_batch_size == bert.micro_batch_size and c.plan.backend == "fsdp2")
    assert same.memory.activations_bytes > 5 * bert.memory.activations_bytes
    assert bert.best.time.compute_s == pytest.approx(same.time.compute_s * 4 / 3, rel=1e-6)
    resnet = bigtrain.plan("resnet-50", gpus=8, gpu="L4", global_batch_size=256)
    assert all(c.plan.activation_checkpointing == "none" for c in resnet.searched)


def test_lora_trains_the_adapters_and_the_head_on_a_frozen_base():
    """ViT-L with LoRA r=16: 8.1M trained parameters (the blocks' linears' adapters and the 1000-class head) beside a
    bf16 base; a third less compute than full training (no weight gradients of the base), far less memory."""
    full = bigtrain.plan("vit-large", gpus=8, gpu="L4", global_batch_size=256, fix={"backend": "ddp"})
    lora = bigtrain.plan("vit-large", gpus=8, gpu="L4", global_batch_size=256, fix={"backend": "ddp"}, method="lora")
    stats = lora.stats
    assert len(stats.adapted) == 24 * 6 and stats.head_params == 1024 * 1000 + 1000
    assert stats.lora_params(16) == sum(16 * (i + o) for i, o in stats.adapted) + stats.head_params
    same = next(c for c in full.searched if c.plan == lora.plan)
    assert lora.best.time.compute_s == pytest.approx(same.time.compute_s * 2 / 3, rel=1e-6)
    assert lora.memory.params_bytes < same.memory.params_bytes / 1.9 and lora.memory.optimizer_bytes < same.memory.optimizer_bytes / 30
    assert "LoRA r=16: 8.10M trained" in lora.explain()
