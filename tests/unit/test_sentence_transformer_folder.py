"""A sentence-transformers folder as bigtrain writes it and reads it back: ``train.pooling: auto`` keeps a folder's
own pooling (a CLS-pooled model such as BGE stays CLS-pooled), in the format sentence-transformers 5 writes (a flag
per mode) and 6 writes (the mode's name); a pooling or a module bigtrain does not train is one line."""

from __future__ import annotations

import json

import pytest

from bigtrain.checkpoint.sentence_transformer import folder_pooling, write_sentence_transformer
from bigtrain.errors import ConfigError


@pytest.mark.parametrize("mode", ["mean", "cls", "last_token"])
def test_the_pooling_written_is_read_back(tmp_path, mode):
    write_sentence_transformer(tmp_path, mode, 8, 16)
    assert folder_pooling(tmp_path) == mode


def test_sentence_transformers_6_s_pooling_and_the_ones_not_trained(tmp_path):
    from sentence_transformers.sentence_transformer.modules import Pooling

    write_sentence_transformer(tmp_path, "mean", 8, 16)
    Pooling(8, pooling_mode="cls").save(str(tmp_path / "1_Pooling"))
    assert folder_pooling(tmp_path) == "cls"
    Pooling(8, pooling_mode="max").save(str(tmp_path / "1_Pooling"))
    with pytest.raises(ConfigError, match=r"pools by 'max', which bigtrain does not train yet; set train.pooling"):
        folder_pooling(tmp_path)
    modules = json.loads((tmp_path / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ConfigError, match=r"with sentence_transformers.models.Dense after its transformer"):
        folder_pooling(tmp_path)


def test_a_folder_without_modules_is_no_sentence_transformers_model(tmp_path):
    assert folder_pooling(tmp_path) is None
