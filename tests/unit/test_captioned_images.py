"""Captioned images for a text-to-image model, as diffusers' training scripts read a folder (a metadata.jsonl with
file_name and text, or a .txt beside each image), and each bad input one line naming the file and what would work."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from bigtrain.data.captioned_images import list_captioned, square_pixels
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
    out = square_pixels(image, 4)
    assert out.shape == (3, 4, 4) and float(out.min()) >= -1.0 and float(out.max()) <= 1.0
    assert torch.equal(out[:, :, 1:3], torch.ones(3, 4, 2))  # the centre white; the edges blend (antialiased)
    assert torch.equal(out, out.flip(-1))  # cropped at the centre
