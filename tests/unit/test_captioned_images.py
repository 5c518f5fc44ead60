"""Captioned images for a text-to-image model, as diffusers' training scripts read a folder (a metadata.jsonl with
file_name and text, or a .txt beside each image) or a HF dataset with an image column, and each bad input one line
naming the file and what would work."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from diffusion_cases import IMAGE_SIZE, TEXT_LEN, captioned_folder, pipeline_folder
from PIL import Image

from bigtrain.data.aspect_buckets import fitted_pixels
from bigtrain.data.captioned_images import list_captioned
from bigtrain.errors import ConfigError


def _image(path, size=(12, 8)):
    Image.fromarray(np.full((size[1], size[0], 3), 200, dtype=np.uint8)).save(path)
    return path


def test_a_metadata_jsonl_names_each_image_and_its_caption(tmp_path):
    for name in ("b.png", "a.png"):
        _image(tmp_path / name)
    rows = [{"file_name": "b.png", "text": " a red fox "}, {"file_name": "a.png", "text": "a cat"}]
    (tmp_path / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = list_captioned("data.path", tmp_path)
    assert [p.name for p in got.paths] == ["b.png", "a.png"] and got.captions == ["a red fox", "a cat"]
    assert got.layout == "metadata.jsonl"


def test_a_txt_beside_each_image_is_its_caption(tmp_path):
    _image(tmp_path / "x.jpg")
    (tmp_path / "x.txt").write_text("a boat\n")
    assert list_captioned("data.path", tmp_path).captions == ["a boat"]


def test_an_image_without_a_caption_is_one_line_naming_it(tmp_path):
    _image(tmp_path / "x.png")
    _image(tmp_path / "y.png")
    (tmp_path / "x.txt").write_text("a boat")
    with pytest.raises(ConfigError) as e:
        list_captioned("data.path", tmp_path)
    said = str(e.value)
    assert "\n" not in said and "y.png has no caption: put it in y.txt beside it" in said


def test_metadata_rows_without_a_file_or_a_caption_are_one_line(tmp_path):
    _image(tmp_path / "a.png")
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "gone.png", "text": "x"}) + "\n")
    with pytest.raises(ConfigError, match=r"row 1 names 'gone.png', which is not a file"):
        list_captioned("data.path", tmp_path)
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "a.png", "label": "x"}) + "\n")
    with pytest.raises(
        ConfigError, match=r"no caption column \(text, caption, prompt\); they have \['file_name', 'label'\]"
    ):
        list_captioned("data.path", tmp_path)


def test_pixels_are_the_centre_square_in_minus_one_to_one():
    image = torch.zeros(3, 8, 16, dtype=torch.uint8)
    image[:, :, 4:12] = 255  # the centre 8 columns white
    out = fitted_pixels(image, (4, 4))
    assert out.shape == (3, 4, 4) and float(out.min()) >= -1.0 and float(out.max()) <= 1.0
    assert torch.equal(out[:, :, 1:3], torch.ones(3, 4, 2))  # the centre white; the edges blend (antialiased)
    assert torch.equal(out, out.flip(-1))  # cropped at the centre


def _as_dataset(folder):
    """A metadata folder's pictures and captions as a HF dataset (the pictures PNG-encoded in its image column)."""
    import datasets

    listed = list_captioned("data.path", folder)
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    pictures = [Image.open(p).convert("RGB") for p in listed.paths]
    return datasets.Dataset.from_dict({"image": pictures, "text": listed.captions}, features=features)


def _pixels(listed, i):
    with listed.picture(i) as picture:
        return np.asarray(picture.convert("RGB"))


def test_a_hf_dataset_saved_or_in_parquet_lists_the_folder_s_pictures_and_captions(tmp_path):
    folder = captioned_folder(tmp_path, 4)
    data = _as_dataset(folder)
    data.save_to_disk(str(tmp_path / "saved"))
    data.to_parquet(str(tmp_path / "rows.parquet"))
    want = list_captioned("data.path", folder)
    for path in (tmp_path / "saved", tmp_path / "rows.parquet"):
        got = list_captioned("data.path", path)
        assert got.layout == "HF dataset" and got.captions == want.captions
        for i in range(4):
            np.testing.assert_array_equal(_pixels(got, i), _pixels(want, i))


def test_a_hf_dataset_without_an_image_or_a_caption_column_is_one_line(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["a disk"]}).save_to_disk(str(tmp_path / "no_image"))
    with pytest.raises(ConfigError, match=r"has no image column \(a datasets.Image feature\); its columns are text"):
        list_captioned("data.path", tmp_path / "no_image")
    data = _as_dataset(captioned_folder(tmp_path, 2)).rename_column("text", "label")
    data.save_to_disk(str(tmp_path / "no_caption"))
    with pytest.raises(
        ConfigError, match=r"has no caption column \(text, caption, prompt\); its columns are image, label"
    ):
        list_captioned("data.path", tmp_path / "no_caption")


@pytest.mark.full
def test_a_hf_dataset_is_encoded_as_the_same_pictures_in_a_folder_are(tmp_path):
    """Through the tiny pipeline's VAE and text encoders: the same arrays, whichever source."""
    from types import SimpleNamespace

    from bigtrain.data.encoded_images import read_encoded

    pipeline, folder = pipeline_folder(tmp_path), captioned_folder(tmp_path, 4)
    _as_dataset(folder).save_to_disk(str(tmp_path / "saved"))
    data_cfg = SimpleNamespace(split="train", cache_dir=str(tmp_path / "cache"))
    encoded = [
        read_encoded(data_cfg, "data.path", str(path), str(pipeline), [(IMAGE_SIZE, IMAGE_SIZE)], TEXT_LEN, (4, 2))[0]
        for path in (folder, tmp_path / "saved")
    ]
    assert len(encoded[0].pooled) == len(encoded[1].pooled) == 4
    for name in ("prompt_embeds", "pooled", "bucket", "slot"):
        np.testing.assert_array_equal(getattr(encoded[0], name), getattr(encoded[1], name))
    (folder_moments,), (dataset_moments,) = encoded[0].moments, encoded[1].moments  # one bucket: the square
    np.testing.assert_array_equal(folder_moments, dataset_moments)
