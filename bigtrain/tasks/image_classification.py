"""``model.task: image-classification``: CNNs (ResNet, ConvNeXt) and vision transformers (ViT) trained on images
with one label each (image folders, HF datasets, the built-in drawn shapes), through
``AutoModelForImageClassification``."""

from __future__ import annotations

from typing import Any

from bigtrain.config.schema import RecipeConfig
from bigtrain.tasks import classifiers
from bigtrain.tasks.spec import EXAMPLES, TaskSpec


def read_images(cfg: RecipeConfig, hf_config: Any) -> tuple[Any, Any]:
    """Images of ``data.path`` (a folder of class folders, a local HF dataset, builtin:shapes) at the size the model
    expects (its image processor's, the recipe's data.image_size, or its config's), and the held-out ones."""
    from bigtrain.data.images import Preprocessing, load_image_examples

    preprocessing = Preprocessing.of(cfg.data, cfg.model.name_or_path, hf_config)

    def read(key: str, path: str) -> Any:
        return load_image_examples(cfg.data, key, path, preprocessing, cfg.train.seed)

    return classifiers.read_examples(cfg, hf_config, read)


def workload(base: Any, data: Any, cfg: RecipeConfig) -> Any:
    """The side the images are trained at."""
    import dataclasses

    return dataclasses.replace(base, image_size=data.preprocessing.size)


def files(cfg: RecipeConfig, hf_config: Any, data: Any) -> Any:
    """The image processor: the model folder's own, else one that resizes and normalises as trained."""
    from bigtrain.checkpoint.export import HfFiles

    p = data.preprocessing
    return HfFiles(image_processor={"size": p.size, "mean": p.mean, "std": p.std})


TASK = TaskSpec(
    name="image-classification",
    summary="image classifiers (ResNet, ConvNeXt, ViT): images with one label each",
    auto_class="AutoModelForImageClassification",
    mapping="MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    suffix="ForImageClassification",
    unit="images",
    outputs=EXAMPLES,
    default_objective="classification",
    read_data=read_images,
    prepare=classifiers.prepare,
    lora_modules=classifiers.head_modules,
    model_facts=classifiers.layer_facts,
    workload=workload,
    planner=classifiers.planner,
    sizes=lambda ask: classifiers.sizes(ask, images=True),
    synthetic=classifiers.synthetic_examples,
    count=classifiers.count_examples,
    export_files=files,
    peft_task_type=None,  # peft has no image-classification type: its plain PeftModel runs the classifier's forward
    metrics=("eval_accuracy", "eval_top5_accuracy", "eval_macro_f1"),
    keys=(*classifiers.KEYS, "data.image_field", "data.image_size", "data.augment"),
    rules=classifiers.RULES,
    example={"model_type": "resnet", "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1],
             "layer_type": "basic"},  # fmt: skip
)
