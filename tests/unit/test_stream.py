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


def twice(shards, kind: str):
    """The records of two epochs as one set of shards (each shard copied after all of them): what a stream's
    second epoch must read, the packing carried on across the end of the first."""
    folder = shards / f"{kind}-twice"
    if not folder.exists():
        folder.mkdir()
        originals = sorted((shards / kind).glob("*.jsonl"))
        for i, f in enumerate(originals + originals):
            (folder / f"part{i:02d}.jsonl").write_text(f.read_text())
    return str(folder / "*.jsonl")


# chat is rendered by a template (a few ms a conversation): its pad case runs in the full tier
READ_ON = [c if c != ("chat", "pad") else pytest.param(*c, marks=pytest.mark.full) for c in CASES]


@pytest.mark.parametrize(("kind", "packing"), READ_ON)
def test_a_saved_position_reads_on_exactly_across_epochs(shards, kind, packing):
    """Saved at the start, mid-epoch, just before, at and after the end of an epoch and in the second: read on
    from there, the rows are those of the records of two epochs written out and packed by the cache."""
    cfg = config(shards, kind, packing)
    epoch = load_token_rows(dataclasses.replace(cfg, streaming=False)).num_rows
    reference = load_token_rows(dataclasses.replace(cfg, streaming=False, path=twice(shards, kind)))
    straight = load_training_rows(cfg, seed=0)
    for at in (1, epoch // 2, epoch - 1, epoch, epoch + 1, epoch + 3):
        straight.micro_batch(np.arange(max(at - 4, 0), at))  # read as a rank would, up to the saved step
        saved = straight.state_at(at)
        resumed = load_training_rows(cfg, seed=0)
        applies, line = resumed.restore(saved, at)
        assert applies, line
        assert f"the stream goes on at row {at}" in line
        rows = np.arange(at, min(at + epoch, reference.num_rows))
        same(resumed.micro_batch(rows), reference.micro_batch(rows))


def test_a_position_saved_with_another_global_batch_reads_on_to_the_new_step(shards):
    """train.global_batch_size changed on resume: the saved mark lies before the new step's first row, and the
    stream reads on to it from there."""
    cfg = config(shards, "text", "stream")
    straight = load_training_rows(cfg, seed=0)
    straight.micro_batch(np.arange(0, 24))
    saved = straight.state_at(24)  # 3 steps of 8
    resumed = load_training_rows(cfg, seed=0)
    applies, _ = resumed.restore(saved, 36)  # 3 steps of 12
    assert applies
    same(resumed.micro_batch(np.arange(36, 48)), load_training_rows(cfg, seed=0).micro_batch(np.arange(36, 48)))


def test_a_position_of_other_data_is_not_used(shards):
    saved = load_training_rows(config(shards, "text", "stream"), seed=0).state_at(5)
    other = load_training_rows(config(shards, "text", "pad"), seed=0)
    applies, line = other.restore(saved, 5)
    assert not applies and "for other data" in line and "read from its start up to row 5" in line
    fresh = load_training_rows(config(shards, "text", "pad"), seed=0)
    same(other.micro_batch(np.arange(5, 9)), fresh.micro_batch(np.arange(5, 9)))


def held_at_most(data) -> list[int]:
    """The rows ``data`` holds each time it finishes one (its peak, not only what is left after a read)."""
    peaks: list[int] = []
    add = data.add

    def counted(*row):
        add(*row)
        peaks.append(len(data._rows) + len(data._marks))

    data.add = counted  # the packer hands its rows to the object's add
    return peaks


def test_a_rank_holds_at_most_a_step_of_rows(shards):
    data = load_training_rows(config(shards, "text", "stream"), seed=0)
    peaks = held_at_most(data)
    for step in range(20):
        data.micro_batch(np.arange(step * 8 + 4, step * 8 + 8))  # rank 1 of 2, 4 rows each, one micro-batch
    assert len(peaks) >= 150 and max(peaks) <= 2 * 8 + 2


def test_reading_from_the_start_to_a_far_row_holds_a_few_rows(shards):
    """A checkpoint without a usable position: the stream is read from its start, forgetting rows as it goes."""
    cfg = config(shards, "text", "stream")
    epoch = load_token_rows(dataclasses.replace(cfg, streaming=False)).num_rows
    data = load_training_rows(cfg, seed=0)
    peaks = held_at_most(data)
    far = 3 * epoch + 5
    got = data.micro_batch(np.arange(far, far + 4))
    assert max(peaks) <= 2 * 4 + 2  # rows and marks: the 4 asked for, not the 3 epochs before them
    same(got, load_training_rows(cfg, seed=0).micro_batch(np.arange(far, far + 4)))


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
