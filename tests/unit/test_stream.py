"""``data.streaming``: a HF dataset read as a stream gives the rows the data cache builds from the same records, in
the same order, and a position saved at any row (across the end of an epoch too) reads on exactly."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from helpers import save_chat_tokenizer

from bigtrain.config.schema import DataConfig
from bigtrain.data.sources import load_token_rows, load_training_rows
from bigtrain.errors import ConfigError

SEQ_LEN = 32


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Three .jsonl shards of chat conversations and three of text, unequal lengths."""
    root = tmp_path_factory.mktemp("stream")
    save_chat_tokenizer(root / "tokenizer")
    for kind in ("chat", "text"):
        (root / kind).mkdir()
        for shard in range(3):
            with open(root / kind / f"part{shard}.jsonl", "w") as f:
                for i in range(40):
                    words = " ".join(f"w{shard}{i}{k}" for k in range(i % 7 + 1))
                    if kind == "text":
                        f.write(json.dumps({"text": words}) + "\n")
                    else:
                        turns = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": words}]
                        f.write(json.dumps({"messages": turns}) + "\n")
    return root


def config(shards, kind: str, packing: str, **changes) -> DataConfig:
    tokenizer = str(shards / "tokenizer") if kind == "chat" else None
    path = str(shards / kind / "*.jsonl")
    cfg = DataConfig(path=path, seq_len=SEQ_LEN, packing=packing, streaming=True, cache_dir=str(shards / "cache"),
                     tokenizer=tokenizer)  # fmt: skip
    return dataclasses.replace(cfg, **changes)


def same(a, b) -> None:
    torch.testing.assert_close(a.input_ids, b.input_ids, rtol=0, atol=0)
    torch.testing.assert_close(a.labels, b.labels, rtol=0, atol=0)
    assert (a.position_ids is None) == (b.position_ids is None)
    if a.position_ids is not None:
        torch.testing.assert_close(a.position_ids, b.position_ids, rtol=0, atol=0)


CASES = [("text", "stream"), ("chat", "documents"), ("chat", "pad"), ("chat", "stream")]


@pytest.mark.parametrize(("kind", "packing"), CASES)
def test_a_stream_gives_the_rows_the_cache_builds(shards, kind, packing):
    cfg = config(shards, kind, packing)
    cached = load_token_rows(dataclasses.replace(cfg, streaming=False))
    streamed = load_training_rows(cfg, seed=0)
    assert "streamed" in streamed.description
    rows = np.arange(cached.num_rows)
    same(streamed.micro_batch(rows), cached.micro_batch(rows))


@pytest.mark.parametrize(("kind", "packing"), CASES)
def test_a_saved_position_reads_on_exactly_across_epochs(shards, kind, packing):
    cfg = config(shards, kind, packing)
    epoch = load_token_rows(dataclasses.replace(cfg, streaming=False)).num_rows
    straight = load_training_rows(cfg, seed=0)
    for at in (1, epoch // 2, epoch + 3):
        straight.micro_batch(np.arange(max(at - 4, 0), at))  # read as a rank would, up to the saved step
        saved = straight.state_at(at)
        want = straight.micro_batch(np.arange(at, at + epoch))  # an epoch on, through the end of one
        resumed = load_training_rows(cfg, seed=0)
        applies, line = resumed.restore(saved, at)
        assert applies, line
        assert f"the stream goes on at row {at}" in line
        same(resumed.micro_batch(np.arange(at, at + epoch)), want)


def test_a_position_of_other_data_is_not_used(shards):
    saved = load_training_rows(config(shards, "chat", "documents"), seed=0).state_at(5)
    other = load_training_rows(config(shards, "chat", "pad"), seed=0)
    applies, line = other.restore(saved, 5)
    assert not applies and "read from its start up to row 5" in line
    fresh = load_training_rows(config(shards, "chat", "pad"), seed=0)
    same(other.micro_batch(np.arange(5, 9)), fresh.micro_batch(np.arange(5, 9)))


def test_a_rank_holds_at_most_a_step_of_rows(shards):
    data = load_training_rows(config(shards, "text", "stream"), seed=0)
    for step in range(20):
        data.micro_batch(np.arange(step * 8 + 4, step * 8 + 8))  # rank 1 of 2, 4 rows each, one micro-batch
        assert len(data._rows) <= 8 and len(data._marks) <= 9


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"eval_fraction": 0.1}, "give data.eval_path"),
        ({"workers": 2}, "data.workers"),
        ({"seq_len": None}, "data.seq_len is required"),
        ({"sources": [{"path": "a.jsonl"}]}, "data.sources"),
    ],
)
def test_what_a_stream_cannot_do_is_refused_by_key(shards, changes, said):
    with pytest.raises(ConfigError, match=said):
        load_training_rows(config(shards, "text", "stream", **changes), seed=0)


def test_a_file_that_cannot_stream_is_named(shards, tmp_path):
    (tmp_path / "book.txt").write_text("one record")
    cfg = dataclasses.replace(config(shards, "text", "stream"), path=str(tmp_path / "book.txt"))
    with pytest.raises(ConfigError, match=r"data.path=.*book.txt' cannot be streamed"):
        load_training_rows(cfg, seed=0)


def test_a_bad_record_is_named_with_its_place_in_the_stream(shards, tmp_path):
    with open(tmp_path / "bad.jsonl", "w") as f:
        for i in range(30):
            f.write(json.dumps({"text": "fine words"} if i != 17 else {"body": "no text field"}) + "\n")
    cfg = dataclasses.replace(config(shards, "text", "stream"), path=str(tmp_path / "bad.jsonl"))
    data = load_training_rows(cfg, seed=0)
    with pytest.raises(ConfigError, match="data.path record 17 has no string field 'text'"):
        data.micro_batch(np.arange(0, 100))
