"""Blended sources (``data.sources``, bigtrain/data/blend.py): one global order, the same at any world size,
each source in its weight's share, every row of a source once per its epoch, any position read at once."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from cases import TINY_LLAMA
from helpers import recipe_dict, run_cli, write_recipe

from bigtrain.config.schema import DataConfig
from bigtrain.data.blend import CYCLE, BlendedRows
from bigtrain.data.loader import StepLoader
from bigtrain.data.order import GlobalOrder
from bigtrain.data.sources import load_training_rows
from bigtrain.errors import ConfigError

SEQ = 8


def write_rows(path, first: int, count: int) -> str:
    """``count`` rows of SEQ ids, row i filled with ``first + i``: a row names its source and itself."""
    ids = np.repeat(np.arange(first, first + count, dtype=np.uint32)[:, None], SEQ, axis=1)
    ids.tofile(path)
    return str(path)


@pytest.fixture
def three(tmp_path):
    """Sources of 50, 120 and 7 rows (ids 1000+, 2000+, 3000+)."""
    return [write_rows(tmp_path / f"s{k}.bin", 1000 * (k + 1), n) for k, n in enumerate((50, 120, 7))]


def blended(paths, shuffle=True, **per_source) -> BlendedRows:
    sources = [{"path": p, **{k: v[i] for k, v in per_source.items()}} for i, p in enumerate(paths)]
    cfg = DataConfig(sources=sources, seq_len=SEQ, token_dtype="uint32", shuffle=shuffle)
    data = load_training_rows(cfg, seed=3)
    assert isinstance(data, BlendedRows)
    return data


def ids_at(data: BlendedRows, positions: np.ndarray) -> np.ndarray:
    return data.micro_batch(positions, positions).input_ids[:, 0].numpy()


def test_the_order_is_the_same_on_1_2_and_4_ranks(three):
    data = blended(three, weight=[0.5, 0.3, 0.2])
    order = GlobalOrder(data.num_rows, 16, shuffle=False, seed=3)
    seen = {}
    for ranks, micro in ((1, 4), (2, 2), (4, 1)):
        steps = []
        for step in range(5):
            rows = []
            for rank in range(ranks):
                loader = StepLoader(data, rank, ranks, micro, torch.device("cpu"), order=order)
                rows += [int(i) for m in loader(step).micro_batches for i in m.input_ids[:, 0]]
            steps.append(rows)
        seen[ranks] = steps
    assert seen[1] == seen[2] == seen[4]
    assert len({i // 1000 for step in seen[1] for i in step}) == 3  # every source is in the first steps


def test_each_source_has_its_weight_s_share_and_each_row_once_per_epoch(three):
    data = blended(three, weight=[0.5, 0.3, 0.2])
    ids = ids_at(data, np.arange(3 * CYCLE))
    share = np.bincount(ids // 1000, minlength=4)[1:] / len(ids)
    np.testing.assert_allclose(share, [0.5, 0.3, 0.2])
    window = ids_at(data, np.arange(100, 100 + 200))  # any stretch of the order: each source near its share
    assert np.abs(np.bincount(window // 1000, minlength=4)[1:] / 200 - [0.5, 0.3, 0.2]).max() < 0.02
    for k, rows in enumerate((50, 120, 7)):
        draws = ids[ids // 1000 == k + 1]
        for epoch in range(len(draws) // rows):  # a permutation of the source per epoch, a new one each epoch
            assert sorted(draws[epoch * rows : (epoch + 1) * rows]) == list(
                range(1000 * (k + 1), 1000 * (k + 1) + rows)
            )
        assert not np.array_equal(draws[:rows], draws[rows : 2 * rows])


def test_epochs_blend_the_sources_by_rows_times_epochs(three):
    data = blended(three, epochs=[1, 1, 4])
    assert data.num_rows == 50 + 120 + 28
    np.testing.assert_allclose(data.weights, np.array([50, 120, 28]) / 198)
    natural = blended(three)  # epochs 1 each: in proportion to the rows
    np.testing.assert_allclose(natural.weights, np.array([50, 120, 7]) / 177)
    assert "s2.bin 14.1% (7 rows, 4.00 epochs per blended epoch)" in blended(three, epochs=[1, 1, 4]).description


def test_any_position_is_read_at_once(three):
    data = blended(three, weight=[0.5, 0.3, 0.2])
    far = np.array([10**12, 10**12 + 1, 7 * 10**11 + 13])
    start = time.perf_counter()
    first = ids_at(data, far)
    assert time.perf_counter() - start < 1.0
    assert np.array_equal(first, ids_at(data, far))  # a function of the position alone
    # against a replay: the k-th slot of a source is its k-th draw
    sources, rows = data.locate(np.arange(2 * CYCLE + 5))
    for s in range(3):
        drawn = rows[sources == s]
        n = data.sources[s].num_rows
        again = [data._row(s, k // n, k % n) for k in range(len(drawn))]
        assert list(drawn) == again


def test_a_blend_s_bad_settings_are_one_line(three):
    cases = [
        ([{"path": three[0], "weight": 1}, {"path": three[1]}], "give every source a weight, or none"),
        ([{"path": three[0], "weight": 0}], r"data.sources\[0\].weight=0 must be a positive number"),
        ([{"path": three[0], "weight": 1, "epochs": 2}], "gives weight and epochs; give one"),
        ([{"path": three[0], "wieght": 1}], r"unknown keys \['wieght'\]"),
        (["web.bin"], r"data.sources\[0\] must be a mapping with a path"),
    ]
    for sources, expected in cases:
        with pytest.raises(ConfigError, match=expected):
            load_training_rows(DataConfig(sources=sources, seq_len=SEQ, token_dtype="uint32"), 0)
    with pytest.raises(ConfigError, match="data.path='x.npy' and data.sources are both set"):
        load_training_rows(DataConfig(path="x.npy", sources=[{"path": three[0]}], seq_len=SEQ), 0)
    with pytest.raises(ConfigError, match="with data.sources give data.eval_path"):
        load_training_rows(DataConfig(sources=[{"path": three[0]}], seq_len=SEQ, eval_fraction=0.1), 0)


@pytest.mark.full  # a training run (a process): CI's second step
def test_a_recipe_with_sources_trains_and_says_the_blend(tmp_path, three):
    chat = tmp_path / "stories.jsonl"
    chat.write_text("".join(json.dumps({"text": f"story {i} " * 6}) + "\n" for i in range(40)))
    recipe = recipe_dict(
        tmp_path / "out",
        "builtin:stories",
        {**TINY_LLAMA, "vocab_size": 320},  # the byte tokenizer's 257 ids
        data={"path": "builtin:stories", "seq_len": 16, "cache_dir": str(tmp_path / "cache"),
              "sources": [{"path": str(chat), "weight": 0.25}, {"path": "builtin:stories", "weight": 0.75}]},
        train={"steps": 2, "global_batch_size": 4},
        checkpoint={"save_final_model": False},
    )  # fmt: skip
    proc = run_cli(["train", str(write_recipe(tmp_path / "r.yaml", recipe))], timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "a blend of 2 sources" in proc.stderr and "25.0% (" in proc.stderr


def test_the_api_routes_refuse_a_blend_in_one_line(three):
    """The HF Trainer / TRL / accelerate routes read one source in row order (api/same_run.py): a blend is refused,
    not silently replaced by data.path."""
    from bigtrain.api.same_run import training_rows
    from bigtrain.config.schema import RecipeConfig

    cfg = RecipeConfig(data=DataConfig(sources=[{"path": three[0]}], seq_len=SEQ, token_dtype="uint32"))
    with pytest.raises(ConfigError, match="the HF Trainer, TRL and accelerate routes read one source"):
        training_rows(cfg)
