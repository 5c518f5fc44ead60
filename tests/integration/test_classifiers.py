"""Classifiers end to end through ``bigtrain train``: a resumed run continues exactly (BatchNorm's running statistics
and the augmentation stream included), a checkpoint resumes on another world size and engine, and a pretrained
folder with another number of labels gets a new head (one line says so) while its body's values are loaded."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import read_metrics, recipe_dict, run_cli, run_torchrun, write_recipe

pytestmark = pytest.mark.full  # the full tier; tests/tiers.py moves some beyond CI (docs/testing.md)

RESNET = dict(model_type="resnet", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")


def resnet_recipe(out, model, **parallel) -> dict:
    model_section = {"config": dict(RESNET)} if model is None else model
    raw = recipe_dict(
        out,
        "builtin:shapes",
        None,
        data={"image_size": 16, "augment": "crop_flip", "shuffle": True},
        train={"steps": 4, "global_batch_size": 8, "lr": 1e-2, "grad_clip": 1.0, "seed": 3},
        parallel={"backend": "ddp", "micro_batch_size": 2, **parallel},
        checkpoint={"every": 2, "keep": 5},
    )
    raw["model"] = model_section
    return raw


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    folder = tmp_path_factory.mktemp("straight")
    path = write_recipe(folder / "recipe.yaml", resnet_recipe(folder / "out", None))
    proc = run_torchrun(["train", str(path)], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return path, folder / "out"


def weights(output_dir):
    from safetensors.torch import load_file

    return load_file(str(output_dir / "model" / "model.safetensors"))


@pytest.mark.parametrize(
    "nproc, overrides, rtol",
    [
        (2, [], 1e-6),  # the same plan: exact
        (1, ["parallel.backend=fsdp2", "parallel.micro_batch_size=4"], None),  # another world: the split changes
    ],
    ids=["same-plan", "fsdp2-1rank"],
)
def test_a_classifier_resumes_with_its_statistics_and_augmentation(straight, tmp_path, nproc, overrides, rtol):
    path, out = straight
    args = ["train", str(path), "--set", f"checkpoint.resume={out / 'checkpoints' / 'step_2'}"]
    args += ["--set", f"output_dir={tmp_path / 'resumed'}"] + [a for o in overrides for a in ("--set", o)]
    proc = run_torchrun(args, nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, ref = read_metrics(tmp_path / "resumed"), read_metrics(out)
    assert [r["step"] for r in got] == [3, 4]
    if rtol is None:  # BatchNorm normalises other micro-batches on one rank: the steps differ, the run goes on
        assert all(abs(r["loss"] - s["loss"]) < 0.5 for r, s in zip(got, ref[2:], strict=True))
        return
    for mine, theirs in zip(got, ref[2:], strict=True):
        for key in ("loss", "grad_norm"):
            assert mine[key] == pytest.approx(theirs[key], rel=rtol), (mine["step"], key)
    mine, theirs = weights(tmp_path / "resumed"), weights(out)
    assert set(mine) == set(theirs) and any("running_mean" in k for k in mine)
    for name, value in theirs.items():
        torch.testing.assert_close(mine[name], value, rtol=rtol, atol=1e-7, msg=name)


def test_a_pretrained_head_of_another_label_count_is_replaced_and_said(tmp_path):
    from transformers import AutoConfig, AutoModelForImageClassification

    spec = {k: v for k, v in RESNET.items() if k != "model_type"}
    torch.manual_seed(0)
    base = AutoModelForImageClassification.from_config(AutoConfig.for_model("resnet", num_labels=3, **spec))
    base.save_pretrained(tmp_path / "base")
    raw = resnet_recipe(tmp_path / "out", {"name_or_path": str(tmp_path / "base")})
    raw["train"].update(steps=1, lr=1e-6)
    proc = run_cli(["train", str(write_recipe(tmp_path / "r.yaml", raw))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the model's head has 3 labels and the data 10 classes: the head is replaced" in proc.stderr
    trained = weights(tmp_path / "out")
    assert trained["classifier.1.weight"].shape == (10, 16)
    before = base.state_dict()["resnet.embedder.embedder.convolution.weight"]
    torch.testing.assert_close(trained["resnet.embedder.embedder.convolution.weight"], before, atol=1e-4, rtol=0)
    config = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert config["id2label"]["0"] == "disk" and config["architectures"] == ["ResNetForImageClassification"]


def test_a_decoder_with_a_score_head_pads_with_the_data_s_pad_id(tmp_path):
    """A causal family as a sequence classifier reads its score at the last token before padding: the config's
    pad_token_id must be the id the texts are padded with (here the byte tokenizer's), or batches of more than one
    example fail (transformers refuses them without one)."""
    from cases import TINY_LLAMA

    rows = [{"text": "a b" * (1 + i % 5), "label": i % 2} for i in range(16)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = recipe_dict(
        tmp_path / "out",
        tmp_path / "t.jsonl",
        {**TINY_LLAMA, "vocab_size": 320},
        data={"seq_len": 16},
        train={"steps": 2, "global_batch_size": 4},
        parallel={"backend": "ddp", "micro_batch_size": 2},
    )
    raw["model"]["task"] = "sequence-classification"
    proc = run_cli(["train", str(write_recipe(tmp_path / "r.yaml", raw))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and config["pad_token_id"] == 256
