"""The data cache (bigtrain/data/cache.py): records are tokenised and packed once, into files every later reader
maps; what changes the rows changes the entry; a build killed half-way or failing on bad input leaves nothing that is
read; processes building one entry at once do not corrupt it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO

from bigtrain.config.schema import DataConfig
from bigtrain.data.cache import default_cache_dir
from bigtrain.data.formats import examples
from bigtrain.data.packing import pack
from bigtrain.data.records import read_records
from bigtrain.data.sources import load_token_rows
from bigtrain.data.tokenizer import load_tokenizer, save_byte_tokenizer
from bigtrain.errors import ConfigError


class ListSink:
    """Rows kept in lists: what the packing gives without any file between."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []
        self.targets: list[list[bool] | None] = []
        self.positions: list[list[int] | None] = []

    def add(self, ids, targets, positions) -> None:
        self.rows.append(list(ids))
        self.targets.append(None if targets is None else list(targets))
        self.positions.append(None if positions is None else list(positions))


def chat_file(path: Path, n: int, bad_line: int | None = None) -> Path:
    with path.open("w") as f:
        for i in range(1, n + 1):
            if i == bad_line:
                f.write('{"messages": [{"role": "user", "content": "hi"}, oops\n')
                continue
            turns = [{"role": "user", "content": f"question {i} " * (i % 5 + 1)}]
            turns.append({"role": "assistant", "content": f"answer {i} " * (i % 7 + 1)})
            f.write(json.dumps({"messages": turns}) + "\n")
    return path


def text_file(path: Path, n: int, bad_line: int | None = None) -> Path:
    with path.open("w") as f:
        for i in range(1, n + 1):
            f.write("{not json\n" if i == bad_line else json.dumps({"text": f"story {i} " * (i % 9 + 1)}) + "\n")
    return path


@pytest.fixture
def tokenizer(tmp_path):
    return str(save_byte_tokenizer(tmp_path / "tok"))


def config(path, tokenizer, cache, **kw) -> DataConfig:
    return DataConfig(path=str(path), tokenizer=tokenizer, cache_dir=str(cache), **{"seq_len": 64, **kw})


def entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.mark.parametrize("packing", ["documents", "pad", "stream"])
def test_rows_from_the_cache_are_the_packed_records_built_then_read(tmp_path, tokenizer, packing):
    path = chat_file(tmp_path / "chat.jsonl", 300)
    cfg = config(path, tokenizer, tmp_path / "cache", packing=packing)
    built = load_token_rows(cfg)
    read = load_token_rows(cfg)
    assert "(built in" in built.cache_note and read.cache_note.endswith("(read)")
    sink = ListSink()
    records = read_records("data.path", str(path), "text", "train")
    counts = pack(examples(records, "chat", load_tokenizer(tokenizer), "text", "data.path"), 64, packing, 256, sink)
    for data in (built, read):
        assert isinstance(data.rows, np.memmap)  # mapped, not held
        assert np.array_equal(np.asarray(data.rows, dtype=np.int64), np.array(sink.rows))
        assert np.array_equal(np.asarray(data.targets), np.array(sink.targets))
        want_positions = None if packing != "documents" else np.array(sink.positions)
        got_positions = None if data.positions is None else np.asarray(data.positions, dtype=np.int64)
        assert (got_positions is None) == (want_positions is None)
        if want_positions is not None:
            assert np.array_equal(got_positions, want_positions)
        assert (data.examples, data.truncated) == (counts.examples, counts.truncated)
    assert counts.examples == 300
    assert entries(tmp_path / "cache") == [Path(built.cache_note.split("data cache ")[1].split(" (")[0]).name]


def test_what_changes_the_rows_changes_the_entry(tmp_path, tokenizer):
    path = chat_file(tmp_path / "chat.jsonl", 50)
    cache = tmp_path / "cache"
    load_token_rows(config(path, tokenizer, cache))
    assert len(entries(cache)) == 1
    load_token_rows(config(path, tokenizer, cache, seq_len=32))  # seq_len
    load_token_rows(config(path, tokenizer, cache, packing="pad"))  # packing
    assert len(entries(cache)) == 3
    # the chat template: the same tokenizer files but for it
    config_file = Path(tokenizer) / "tokenizer_config.json"
    settings = json.loads(config_file.read_text())
    template_file = Path(tokenizer) / "chat_template.jinja"
    if template_file.is_file():
        template_file.write_text(template_file.read_text().replace("<|im_start|>", "<|im_start|> "))
    else:
        settings["chat_template"] = settings["chat_template"].replace("<|im_start|>", "<|im_start|> ")
        config_file.write_text(json.dumps(settings))
    changed = load_token_rows(config(path, tokenizer, cache))
    assert "(built in" in changed.cache_note and len(entries(cache)) == 4
    # another tokenizer folder with the same files is the same tokenizer: read
    same = tmp_path / "same_tok"
    same.mkdir()
    for f in Path(tokenizer).iterdir():
        (same / f.name).write_bytes(f.read_bytes())
    assert load_token_rows(config(path, str(same), cache)).cache_note.endswith("(read)")
    # the data written again (one more record)
    time.sleep(0.01)
    chat_file(path, 51)
    grown = load_token_rows(config(path, tokenizer, cache))
    assert "(built in" in grown.cache_note and grown.examples == 51 and len(entries(cache)) == 5


def test_a_bad_record_is_named_by_its_line_and_leaves_no_entry(tmp_path, tokenizer):
    path = text_file(tmp_path / "big.jsonl", 20_000, bad_line=17_321)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match="line 17321 is not JSON"):
        load_token_rows(config(path, None, cache))
    assert entries(cache) == []
    assert not list(cache.glob(".*.partial"))


def test_the_default_cache_is_the_hf_datasets_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert default_cache_dir() == tmp_path / "hf" / "datasets" / "bigtrain"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "ds"))
    assert default_cache_dir() == tmp_path / "ds" / "bigtrain"


LOAD = textwrap.dedent(
    """
    import sys, time
    from bigtrain.config.schema import DataConfig
    from bigtrain.data.sources import load_token_rows
    from bigtrain.errors import ConfigError
    cfg = DataConfig(path=sys.argv[1], cache_dir=sys.argv[2], seq_len=64, tokenizer=sys.argv[3] or None)
    while time.time() < float(sys.argv[4]):  # start together
        time.sleep(0.001)
    try:
        data = load_token_rows(cfg)
    except ConfigError as e:
        print("ERROR", e, flush=True)
        raise SystemExit(2)
    print(data.cache_note, int(data.rows[-1].sum()), data.num_rows, flush=True)
    """
)


def loaders(path: Path, cache: Path, tokenizer: str | None, n: int) -> list[subprocess.Popen]:
    at = time.time() + 3.0
    return [
        subprocess.Popen(
            [sys.executable, "-c", LOAD, str(path), str(cache), tokenizer or "", str(at)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]


@pytest.mark.full  # processes started together: CI's second step
def test_processes_building_one_entry_at_once_share_one_build(tmp_path, tokenizer):
    """Three processes (three ranks, or three jobs) wanting the same entry at once: one builds, the others wait and
    read it; every one sees the same rows, and the cache holds one entry."""
    path = chat_file(tmp_path / "chat.jsonl", 3000)
    cache = tmp_path / "cache"
    outs = [p.communicate(timeout=300) for p in loaders(path, cache, tokenizer, 3)]
    lines = [out.strip().splitlines()[-1] for out, _ in outs]
    assert sum("(built in" in line for line in lines) == 1, lines
    assert sum("(built by another process, waited" in line for line in lines) == 2, lines
    assert sum(line.split(") ")[1] == lines[0].split(") ")[1] for line in lines) == 3, lines
    assert len(entries(cache)) == 1


@pytest.mark.full  # processes started together: CI's second step
def test_a_bad_record_fails_every_process_waiting_for_the_build(tmp_path):
    path = text_file(tmp_path / "big.jsonl", 60_000, bad_line=54_321)
    outs = [p.communicate(timeout=300) for p in loaders(path, tmp_path / "cache", None, 2)]
    for out, err in outs:
        assert out.strip().splitlines()[-1].startswith("ERROR data.path="), (out, err[-500:])
        assert "line 54321 is not JSON" in out
    assert entries(tmp_path / "cache") == []


@pytest.mark.full  # processes started together: CI's second step
def test_a_build_killed_half_way_is_never_read(tmp_path):
    """SIGKILL while the rows are being written: no entry; the next reader builds it whole (and removes what the
    killed build left)."""
    path = text_file(tmp_path / "big.jsonl", 400_000)
    cache = tmp_path / "cache"
    (proc,) = loaders(path, cache, None, 1)
    deadline = time.time() + 120
    while not any(p.is_dir() and any(p.iterdir()) for p in cache.glob(".*.partial")) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # rows being written
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert entries(cache) == [] and list(cache.glob(".*.partial"))
    data = load_token_rows(config(path, None, cache))
    assert "(built in" in data.cache_note and data.examples == 400_000
    assert not list(cache.glob(".*.partial"))


def test_preference_pairs_are_built_once_then_read(tmp_path, tokenizer):
    """Pairs: each side one row, in the cache; the second read maps what the first built (the same ids, the answer
    alone labelled)."""
    from bigtrain.data.preference import load_preference_pairs

    path = tmp_path / "pairs.jsonl"
    with path.open("w") as f:
        for i in range(20):
            f.write(json.dumps({"prompt": f"q{i} ", "chosen": "yes " * (i % 3 + 1), "rejected": "no"}) + "\n")
    cfg = DataConfig(path=str(path), tokenizer=tokenizer, seq_len=24, cache_dir=str(tmp_path / "cache"))
    built, read = load_preference_pairs(cfg), load_preference_pairs(cfg)
    assert "(built in" in built.cache_note and read.cache_note.endswith("(read)")
    assert built.ids.shape == read.ids.shape == (20, 2, 24) and np.array_equal(built.ids, read.ids)
    batch = read.micro_batch(np.array([1]))
    chosen = batch.input_ids[0].tolist()
    prompt = len(load_tokenizer(tokenizer).encode_prompt("q1 "))
    assert bytes(chosen[prompt : prompt + 8]).decode() == "yes yes "
    assert read.targets[1, 0, :prompt].sum() == 0 and read.targets[1, 0, prompt : prompt + 9].all()


def test_classifier_texts_are_built_once_then_read(tmp_path):
    """Texts with labels: tokenised once into flat files (examples of any length), the same examples read back."""
    from bigtrain.data.text_classes import load_text_examples

    path = tmp_path / "texts.jsonl"
    with path.open("w") as f:
        for i in range(30):
            f.write(json.dumps({"text": "word " * (i % 7), "label": ["neg", "pos"][i % 2]}) + "\n")
    cfg = DataConfig(path=str(path), seq_len=16, cache_dir=str(tmp_path / "cache"))
    built = load_text_examples(cfg, "data.path", str(path), None)
    read = load_text_examples(cfg, "data.path", str(path), None)
    assert "(built in" in built.cache_note and read.cache_note.endswith("(read)")
    assert read.class_names == ["neg", "pos"] and list(read.labels[:4]) == [0, 1, 0, 1]
    assert [len(read.ids[i]) for i in range(8)] == [0, 5, 10, 15, 16, 16, 16, 0]  # cut at seq_len
    assert int(read.was_cut.sum()) == sum(len("word " * (i % 7)) > 16 for i in range(30))
    batch = read.micro_batch(np.array([1, 2]))
    assert batch.inputs["input_ids"].shape == (2, 10) and bytes(read.ids[1].tolist()) == b"word "


def test_grpo_prompts_are_built_once_then_read_with_their_fields(tmp_path, tokenizer):
    """Prompts: tokenised once (the end kept to max_prompt_length), each record's prompt and other fields kept as the
    reward functions read them; a later start maps the entry; another max_prompt_length is another entry."""
    from types import SimpleNamespace

    from bigtrain.data.prompts import read_prompts

    path = tmp_path / "prompts.jsonl"
    with path.open("w") as f:
        for i in range(12):
            f.write(json.dumps({"prompt": f"{i}+{i}=" * (i % 3 + 1), "answer": str(2 * i), "meta": {"i": [i]}}) + "\n")
    cache = tmp_path / "cache"

    def run(**kw):
        data = DataConfig(path=str(path), tokenizer=tokenizer, cache_dir=str(cache), **kw)
        return read_prompts(SimpleNamespace(data=data, train=SimpleNamespace(global_batch_size=8)), 16, 2)

    built, read = run(), run()
    assert "(built in" in built.cache_note and read.cache_note.endswith("(read)") and len(entries(cache)) == 1
    assert isinstance(read.ids.flat, np.memmap) and read.num_rows == 12
    tok = load_tokenizer(tokenizer)
    for i in (0, 5, 11):
        assert read.ids[i].tolist() == tok.encode_prompt(f"{i}+{i}=" * (i % 3 + 1))
        assert read.prompts[i] == f"{i}+{i}=" * (i % 3 + 1)
        assert read.fields[i] == {"answer": str(2 * i), "meta": {"i": [i]}} and read.where[i] == f"line {i + 1}"
    assert read.seq_len == max(len(read.ids[i]) for i in range(12)) + 16
    cut = run(max_prompt_length=5)
    assert len(entries(cache)) == 2 and cut.cut == 8 and cut.ids[11].tolist() == read.ids[11].tolist()[-5:]


def test_a_prompt_field_json_cannot_keep_is_named(tmp_path):
    from datetime import date

    from bigtrain.data.prompts import _as_json

    assert json.loads(_as_json("line 3", {"prompt": "p", "n": 1.5}, "data.path")) == ["line 3", "p", {"n": 1.5}]
    with pytest.raises(ConfigError, match=r"data.path: record 7's field 'when' holds a date, which the prompt cache"):
        _as_json("record 7", {"prompt": "p", "when": date(2026, 1, 1)}, "data.path")
