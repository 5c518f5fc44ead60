"""``bigtrain generate`` on a text-to-image run: which folders it takes for one, and its bad input, one line each
(the pictures themselves: tests/integration/test_text_to_image_export.py)."""

from __future__ import annotations

import argparse

import pytest
import yaml

from bigtrain.cli.generate import add_generate_arguments
from bigtrain.cli.generate_image import is_text_to_image, run_image_command
from bigtrain.errors import ConfigError


def _run(folder, task: str = "text-to-image", pipeline: str = "moved/pipeline"):
    folder.mkdir(parents=True, exist_ok=True)
    recipe = {"model": {"name_or_path": pipeline, "task": task}, "data": {"image_size": 16}}
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return folder


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_generate_arguments(parser)
    return parser.parse_args(argv)


def test_a_text_to_image_run_or_a_pipeline_folder_draws_and_a_language_model_run_does_not(tmp_path):
    assert is_text_to_image(_run(tmp_path / "t2i"))
    assert not is_text_to_image(_run(tmp_path / "lm", task="causal-lm"))
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "model_index.json").write_text("{}")
    assert is_text_to_image(tmp_path / "pipeline")
    assert not is_text_to_image(tmp_path / "nothing")


@pytest.mark.parametrize(
    "argv, said",
    [
        ((), "give --prompt"),
        (("--prompt", "a disk", "--out", "picture.txt"), "--out picture.txt: name a picture file"),
        (("--prompt", "a disk", "--steps", "0"), "--steps=0 must be at least 1"),
        (("--prompt", "a disk", "--chat"), "drop them for a text-to-image one"),
        (("--prompt", "a disk", "--size", "640"), "--size 640: give WIDTHxHEIGHT in px, e.g. 640x384"),
        (("--prompt", "a disk"), "give the pipeline the run trained from with --pipeline"),
    ],
)
def test_bad_input_is_one_line_naming_what_would_work(tmp_path, argv, said):
    run = _run(tmp_path / "run")
    with pytest.raises(ConfigError, match=said.replace(".", r"\.")):
        run_image_command(_args(str(run), *argv))


def test_a_size_the_pipeline_does_not_tile_names_the_nearest_that_it_does():
    from bigtrain.cli.generate_image import picture_size

    assert picture_size("640x384", 16) == (640, 384) and picture_size(None, 16) is None
    with pytest.raises(ConfigError, match="--size 650x390: the pipeline draws multiples of 16 px; try 656x384"):
        picture_size("650x390", 16)
