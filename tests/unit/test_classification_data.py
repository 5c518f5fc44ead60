"""Classification data: the task read from the model, images and texts with labels, augmentation that is the same
for every plan, and the bad inputs that must be one line each."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from bigtrain.config.schema import DataConfig, ModelConfig, RecipeConfig
from bigtrain.data.images import Preprocessing, load_image_examples
from bigtrain.data.loader import StepLoader
from bigtrain.data.order import GlobalOrder
from bigtrain.data.text_classes import load_text_examples
from bigtrain.errors import ConfigError
from bigtrain.job import resolve_job
from bigtrain.models.build import load_hf_config

RESNET = dict(model_type="resnet", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")


@pytest.mark.parametrize(
    "config, task",
    [
        (RESNET, "image-classification"),
        (dict(model_type="vit", hidden_size=32, num_hidden_layers=1, num_attention_heads=2), "image-classification"),
        (
            dict(model_type="bert", hidden_size=32, num_hidden_layers=1, num_attention_heads=2),
            "sequence-classification",
        ),
        (dict(model_type="llama", hidden_size=32, num_hidden_layers=1, num_attention_heads=2), "causal-lm"),
    ],
)
def test_the_task_is_read_from_the_family_and_recorded_as_transformers_records_it(config, task):
    job, hf_config = resolved(ModelConfig(config=dict(config)))
    assert job.task.name == task
    assert hf_config.architectures[0].endswith(
        {"image-classification": "ForImageClassification", "sequence-classification": "ForSequenceClassification"}
        .get(task, "ForCausalLM")
    )  # fmt: skip


def resolved(model: ModelConfig):
    """The job start-up resolves for a recipe of this model (its task, its objective) and the config it builds."""
    return resolve_job(RecipeConfig(model=model), load_hf_config(model))


def test_a_task_the_family_cannot_serve_is_one_line_naming_what_it_serves():
    with pytest.raises(ConfigError, match="has no image-classification class in transformers.*it serves: causal-lm"):
        resolved(ModelConfig(config=dict(model_type="llama"), task="image-classification"))
    with pytest.raises(ConfigError, match="model.task='detection' is not a task"):
        resolved(ModelConfig(config=dict(RESNET), task="detection"))


def test_an_image_key_set_for_a_task_that_does_not_read_it_is_one_line_naming_the_tasks_that_do():
    llama = ModelConfig(config=dict(model_type="llama"))
    with pytest.raises(ConfigError, match=r"data.aspect_buckets=True is read by model.task text-to-image; this "
                       r"recipe's task is causal-lm: drop data.aspect_buckets"):  # fmt: skip
        resolve_job(RecipeConfig(model=llama, data=DataConfig(aspect_buckets=True)), load_hf_config(llama))
    with pytest.raises(ConfigError, match=r"data.image_size=32 is read by model.task image-classification or "
                       r"text-to-image; this recipe's task is causal-lm"):  # fmt: skip
        resolve_job(RecipeConfig(model=llama, data=DataConfig(image_size=32)), load_hf_config(llama))
    resnet = ModelConfig(config=dict(RESNET))
    with pytest.raises(ConfigError, match="data.aspect_buckets=True is read by model.task text-to-image; this "):
        resolve_job(RecipeConfig(model=resnet, data=DataConfig(aspect_buckets=True)), load_hf_config(resnet))


def shapes(augment: bool, seed: int = 3):
    cfg = DataConfig(path="builtin:shapes")
    data = load_image_examples(cfg, "data.path", "builtin:shapes", Preprocessing(16), seed)
    return data.subset(np.arange(data.num_rows), data.description, augment=augment)


def test_step_k_trains_on_the_same_augmented_pixels_whatever_the_split():
    """The global order and each image's augmentation seed are the plan's business only through which rank reads
    it: one rank reading micro-batches of 4 sees exactly what two ranks reading micro-batches of 1 see together."""
    data = shapes(augment=True)
    order = GlobalOrder(data.num_rows, 8, shuffle=True, seed=3)
    cpu = torch.device("cpu")
    whole = StepLoader(data, 0, 1, 4, cpu, order=order)
    halves = [StepLoader(data, r, 2, 1, cpu, order=order) for r in range(2)]
    for step in (0, 251):  # the second crosses into another epoch (2000 images, 8 per step)
        one = torch.cat([m.inputs["pixel_values"] for m in whole(step).micro_batches])
        two = torch.cat([m.inputs["pixel_values"] for h in halves for m in h(step).micro_batches])
        assert torch.equal(one, two)
        assert torch.equal(torch.cat([m.labels for m in whole(step).micro_batches]), torch.from_numpy(
            data.labels[order.global_batch(step)]))  # fmt: skip


def test_augmentation_differs_per_visit_and_evaluation_is_deterministic():
    train, held = shapes(augment=True), shapes(augment=False)
    rows = np.array([0, 1])
    first = train.micro_batch(rows, np.array([0, 1])).inputs["pixel_values"]
    again = train.micro_batch(rows, np.array([0, 1])).inputs["pixel_values"]
    next_epoch = train.micro_batch(rows, np.array([2000, 2001])).inputs["pixel_values"]
    assert torch.equal(first, again) and not torch.equal(first, next_epoch)
    assert first.shape == (2, 3, 16, 16)
    assert torch.equal(held.micro_batch(rows).inputs["pixel_values"], held.micro_batch(rows).inputs["pixel_values"])


def _png(path, colour):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((12, 10, 3), colour, dtype=np.uint8)).save(path)


def test_an_image_folder_reads_its_classes_in_sorted_order(tmp_path):
    _png(tmp_path / "zebra" / "a.png", 10)
    _png(tmp_path / "cat" / "b.png", 200)
    _png(tmp_path / "cat" / "sub" / "c.jpg", 90)
    data = load_image_examples(DataConfig(path=str(tmp_path)), "data.path", str(tmp_path), Preprocessing(8), 0)
    assert data.class_names == ["cat", "zebra"] and list(data.labels) == [0, 0, 1]
    assert data.micro_batch(np.array([2])).inputs["pixel_values"].shape == (1, 3, 8, 8)


def test_a_16_bit_image_is_scaled_not_clipped_and_reading_warns_nothing(tmp_path):
    """A 16-bit grayscale PNG (a full-range ramp) reaches the model as the same ramp in 8 bits: PIL's own
    convert("RGB") would clip it at 255, 99% white."""
    ramp = np.linspace(0, 65535, 64 * 64).astype(np.uint16).reshape(64, 64)
    (tmp_path / "ramp").mkdir()
    Image.fromarray(ramp).save(tmp_path / "ramp" / "a.png")
    _png(tmp_path / "plain" / "b.png", 10)
    data = load_image_examples(DataConfig(path=str(tmp_path)), "data.path", str(tmp_path), Preprocessing(64), 0)
    ramp_row = data.class_names.index("ramp")
    pixels = np.asarray(data.read(int(np.flatnonzero(data.labels == ramp_row)[0])))
    assert pixels.shape == (64, 64, 3) and pixels.dtype == np.uint8
    assert (pixels == 255).mean() < 0.01 and abs(pixels.mean() - 127.5) < 1.0
    with warnings.catch_warnings(record=True) as said:  # torch's "non-writable NumPy array", once per rank
        warnings.simplefilter("always")
        data.micro_batch(np.array([0, 1]))
    assert [str(w.message) for w in said] == []


def test_an_evaluation_folder_lacking_a_class_evaluates_and_one_with_an_unknown_class_is_one_line(tmp_path, caplog):
    """A held-out folder without one of the training classes is common (a rare class): it is read with the training
    classes' indices, said once; a held-out class the model has no output for is refused."""
    import logging

    from bigtrain.tasks.image_classification import read_images

    for name, colour in (("ant", 10), ("bee", 120), ("cat", 240)):
        _png(tmp_path / "train" / name / "a.png", colour)
        _png(tmp_path / "train" / name / "b.png", colour)
    _png(tmp_path / "eval" / "ant" / "a.png", 10)
    _png(tmp_path / "eval" / "cat" / "a.png", 240)
    cfg = RecipeConfig(
        model=ModelConfig(task="image-classification", config={"model_type": "resnet"}),
        data=DataConfig(path=str(tmp_path / "train"), eval_path=str(tmp_path / "eval"), image_size=8),
    )
    with caplog.at_level(logging.INFO, logger="bigtrain"):
        data, held = read_images(cfg, None)
    assert held.class_names == data.class_names == ["ant", "bee", "cat"]
    assert list(held.labels) == [0, 2]  # ant and cat, as the model's outputs number them
    said = [r.getMessage() for r in caplog.records if "no example of" in r.getMessage()]
    assert said == [
        "data.eval_path has no example of 1 of the 3 training classes (bee): it is evaluated as it is (macro-F1 over "
        "the classes its labels or the model's predictions hold)"
    ]
    _png(tmp_path / "eval" / "dog" / "a.png", 60)
    with pytest.raises(ConfigError, match=r"has the classes \['dog'\] that data.path has not"):
        read_images(cfg, None)


def test_an_image_folder_s_index_is_built_once_and_rebuilt_when_an_image_comes(tmp_path, monkeypatch):
    """Every image is listed and its header checked once, into the data cache; a later start maps the index and
    opens no image until a step decodes it; an image added (its folder's time changes) builds the index again."""
    import bigtrain.data.images as images

    for name, colour in (("ant", 10), ("bee", 120)):
        for k in range(3):
            _png(tmp_path / "data" / name / f"{k}.png", colour + k)
    checked = []
    real_check = images._check_image
    monkeypatch.setattr(images, "_check_image", lambda key, path: checked.append(path) or real_check(key, path))
    cfg = DataConfig(path=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))

    def load():
        return load_image_examples(cfg, "data.path", cfg.path, Preprocessing(8), 0)

    first = load()
    assert len(checked) == 6 and "(built in" in first.cache_note
    second = load()
    assert len(checked) == 6 and second.cache_note.endswith("(read)")
    assert second.class_names == ["ant", "bee"] and list(second.labels) == [0, 0, 0, 1, 1, 1]
    assert np.array_equal(second.read(4), first.read(4)) and second.read(4)[0, 0, 0] == 121
    _png(tmp_path / "data" / "bee" / "3.png", 200)
    third = load()
    assert len(checked) == 13 and "(built in" in third.cache_note and list(third.labels) == [0, 0, 0, 1, 1, 1, 1]


def test_an_image_folder_with_one_class_or_a_broken_image_is_one_line(tmp_path):
    _png(tmp_path / "only" / "a.png", 10)
    key = "data.path"
    with pytest.raises(ConfigError, match="has only 'only' as a class folder with images; .* at least two"):
        load_image_examples(DataConfig(path=str(tmp_path)), key, str(tmp_path), Preprocessing(8), 0)
    _png(tmp_path / "other" / "b.png", 20)
    (tmp_path / "other" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ConfigError, match=r"broken.png is not a readable image .*remove or replace it"):
        load_image_examples(DataConfig(path=str(tmp_path)), key, str(tmp_path), Preprocessing(8), 0)


def test_texts_pad_per_micro_batch_and_name_their_classes(tmp_path):
    path = tmp_path / "texts.jsonl"
    rows = [
        {"text": "short", "label": "neg"},
        {"text": "a longer text", "label": "pos"},
        {"text": "x" * 99, "label": "neg"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_text_examples(DataConfig(path=str(path), seq_len=16), "data.path", str(path), None)
    assert data.class_names == ["neg", "pos"] and list(data.labels) == [0, 1, 0] and data.truncated == 1
    batch = data.micro_batch(np.array([0, 1]))
    assert batch.inputs["input_ids"].shape == (2, len("a longer text"))
    assert batch.inputs["attention_mask"].sum(1).tolist() == [5, 13]
    with pytest.raises(ConfigError, match="record 1|line 1"):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({"text": "no label"}) + "\n")
        load_text_examples(DataConfig(path=str(bad), seq_len=16), "data.path", str(bad), None)


def test_the_data_s_classes_become_the_model_s_labels(tmp_path):
    from types import SimpleNamespace

    from bigtrain.tasks.classifiers import prepare

    built = RecipeConfig(model=ModelConfig(config=dict(RESNET)))
    job, config = resolve_job(built, load_hf_config(built.model))

    def classes(*names):
        return SimpleNamespace(class_names=list(names))

    made = prepare(built, config, classes("cat", "dog"))  # a model from its config: its head is new anyway
    assert made.notes == () and not made.new_head
    assert made.hf_config.id2label == {0: "cat", 1: "dog"} and made.hf_config.num_labels == 2
    assert config.num_labels != 2 or config.id2label != made.hf_config.id2label  # the given config is not changed
    made.hf_config.save_pretrained(tmp_path)  # a pretrained folder with a head of two labels
    folder = RecipeConfig(model=ModelConfig(name_or_path=str(tmp_path)))
    kept = prepare(folder, made.hf_config, classes("x", "y"))  # the same count: kept, renamed
    assert kept.notes == () and not kept.new_head and kept.hf_config.id2label == {0: "x", 1: "y"}
    replaced = prepare(folder, made.hf_config, classes("a", "b", "c"))
    assert replaced.new_head and "2 labels and the data 3 classes" in replaced.notes[0]


def test_an_image_size_nobody_gives_is_one_line():
    config = load_hf_config(ModelConfig(config=dict(RESNET)))
    with pytest.raises(ConfigError, match="data.image_size is needed: a model built from model.config has no image"):
        Preprocessing.of(DataConfig(path="builtin:shapes"), None, config)
    vit = load_hf_config(ModelConfig(config=dict(model_type="vit", image_size=48)))
    assert Preprocessing.of(DataConfig(path="builtin:shapes"), None, vit).size == 48


def test_dataloader_workers_read_the_same_steps_in_order_and_restart_where_asked():
    data = shapes(augment=True)
    order = GlobalOrder(data.num_rows, 8, shuffle=True, seed=3)
    cpu = torch.device("cpu")
    here = StepLoader(data, 1, 2, 2, cpu, order=order)
    ahead = StepLoader(data, 1, 2, 2, cpu, order=order, workers=2)
    for step in (0, 1, 2, 3, 7, 8):  # in order, then a jump (a resumed run starts where its checkpoint was)
        mine, theirs = ahead(step), here(step)
        assert mine.tokens == theirs.tokens == 4
        for a, b in zip(mine.micro_batches, theirs.micro_batches, strict=True):
            assert torch.equal(a.inputs["pixel_values"], b.inputs["pixel_values"])
            assert torch.equal(a.labels, b.labels)


def test_a_dataset_root_whose_folders_are_splits_is_refused_naming_the_class_folder(tmp_path):
    _png(tmp_path / "train" / "cat" / "a.png", 10)
    _png(tmp_path / "val" / "dog" / "b.png", 20)
    with pytest.raises(ConfigError, match=r"hold no image themselves, only folders \(cat\); point data.path at"):
        load_image_examples(DataConfig(path=str(tmp_path)), "data.path", str(tmp_path), Preprocessing(8), 0)


def test_unlabelled_rows_of_a_class_label_column_are_refused(tmp_path):
    import datasets

    images = [Image.fromarray(np.full((8, 8, 3), c, dtype=np.uint8)) for c in (10, 200)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    datasets.Dataset.from_dict({"image": images, "label": [0, -1]}, features=features).save_to_disk(tmp_path / "d")
    with pytest.raises(ConfigError, match="holds the label -1 .unlabelled rows.: train on a labelled split"):
        load_image_examples(DataConfig(path=str(tmp_path / "d")), "data.path", str(tmp_path / "d"), Preprocessing(8), 0)


def test_synchronised_batchnorm_matches_torch_s_far_from_zero(tmp_path):
    """The synchronised statistics (one rank's group here) equal torch's BatchNorm on inputs whose mean dwarfs their
    spread, where E[x²] - E[x]² in fp32 would lose the variance; gradients included."""
    import torch.distributed as dist
    from helpers import free_port

    from bigtrain.parallel.transforms.batch_norm import DataParallelBatchNorm, _swapped

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        plain = torch.nn.BatchNorm2d(3)
        synced = torch.nn.BatchNorm2d(3)
        synced.__class__ = _swapped(torch.nn.BatchNorm2d)
        synced.group = dist.group.WORLD
        assert isinstance(synced, DataParallelBatchNorm)
        with torch.no_grad():
            plain.running_mean.fill_(0.0)
            synced.running_mean.fill_(0.0)
        for _ in range(2):
            x = (30 + 0.1 * torch.randn(4, 3, 5, 5)).requires_grad_()
            y = x.detach().clone().requires_grad_()
            with warnings.catch_warnings(record=True) as said:  # once a deprecation warning per rank and call
                warnings.simplefilter("always")
                a, b = plain(x), synced(y)
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-3)
                a.square().sum().backward()
                b.square().sum().backward()
            assert [str(w.message) for w in said] == []
            torch.testing.assert_close(y.grad, x.grad, rtol=1e-3, atol=1e-2)
        torch.testing.assert_close(synced.running_var, plain.running_var, rtol=1e-3, atol=1e-7)
        torch.testing.assert_close(synced.running_mean, plain.running_mean)
    finally:
        dist.destroy_process_group()
