"""Pre-tokenised corpora (bigtrain/data/token_files.py): a flat token file as nanoGPT writes it and Megatron's
indexed .bin/.idx pair, mapped without a copy; a Megatron pair's documents packed whole through the data cache."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from bigtrain.config.schema import DataConfig
from bigtrain.data.formats import Example
from bigtrain.data.packing import pack
from bigtrain.data.sources import check_vocabulary, load_token_rows
from bigtrain.errors import ConfigError


def write_megatron(prefix, docs: list[list[int]], dtype=np.uint16) -> str:
    """A Megatron indexed dataset as megatron/core/datasets/indexed_dataset.py's writer lays it out: the ids of
    every document in the .bin; in the .idx the header MMIDIDX\\0\\0, version 1 (u64), the dtype code (u8: 8 is
    uint16, 4 int32), the sequence and document counts (u64), each sequence's length (int32), its byte offset in
    the .bin (int64), and the document index (int64, one sequence per document here, with the closing 0..n)."""
    code = {np.uint16: 8, np.int32: 4}[dtype]
    item = np.dtype(dtype).itemsize
    lengths = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64) * item]).astype(np.int64)
    np.concatenate([np.asarray(d, dtype=dtype) for d in docs]).tofile(f"{prefix}.bin")
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(docs), len(docs) + 1))
        f.write(lengths.tobytes() + pointers.tobytes() + np.arange(len(docs) + 1, dtype=np.int64).tobytes())
    return f"{prefix}.bin"


def docs_of(seed: int, n: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 1000, size=int(rng.integers(1, 40))).tolist() for _ in range(n)]


def test_a_flat_token_file_is_its_ids_cut_into_rows_without_a_copy(tmp_path):
    ids = np.random.default_rng(0).integers(0, 50_000, size=10 * 16 + 7).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")  # nanoGPT's prepare.py
    data = load_token_rows(DataConfig(path=str(tmp_path / "train.bin"), seq_len=16))
    assert isinstance(data.rows.base, np.memmap) or isinstance(data.rows, np.memmap)
    assert data.rows.shape == (10, 16) and np.array_equal(data.rows, ids[:160].reshape(10, 16))
    assert (
        data.targets is None
        and data.positions is None
        and "flat uint16 tokens, 10 stream-packed rows" in (data.description)
    )
    wide = np.arange(64, dtype=np.uint32) + 70_000
    wide.tofile(tmp_path / "wide.bin")
    rows = load_token_rows(DataConfig(path=str(tmp_path / "wide.bin"), seq_len=8, token_dtype="uint32")).rows
    assert np.array_equal(rows, wide.reshape(8, 8))
    with pytest.raises(ConfigError, match=r"token id 70000 \(row 0, position 0\) outside the model's vocabulary"):
        check_vocabulary(load_token_rows(DataConfig(path=str(tmp_path / "wide.bin"), seq_len=8,
                                                  token_dtype="uint32")), 50_000, "wide.bin")  # fmt: skip


def test_a_flat_file_s_bad_settings_are_one_line(tmp_path):
    np.arange(15, dtype=np.uint8).tofile(tmp_path / "odd.bin")
    with pytest.raises(ConfigError, match="15 bytes, not a whole number of uint16 ids; set data.token_dtype"):
        load_token_rows(DataConfig(path=str(tmp_path / "odd.bin"), seq_len=4))
    np.arange(16, dtype=np.uint16).tofile(tmp_path / "flat.bin")
    with pytest.raises(ConfigError, match="is a flat token file .* use data.packing=stream"):
        load_token_rows(DataConfig(path=str(tmp_path / "flat.bin"), seq_len=4, packing="documents"))
    with pytest.raises(ConfigError, match="data.seq_len is required for token files"):
        load_token_rows(DataConfig(path=str(tmp_path / "flat.bin")))
    with pytest.raises(ConfigError, match="holds 16 tokens, fewer than one row of data.seq_len=32"):
        load_token_rows(DataConfig(path=str(tmp_path / "flat.bin"), seq_len=32))
    with pytest.raises(ConfigError, match="does not exist; give a token file"):
        load_token_rows(DataConfig(path=str(tmp_path / "none.bin"), seq_len=4))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_a_megatron_pair_streams_as_its_ids_and_packs_its_documents_whole(tmp_path, dtype):
    docs = docs_of(1, 200)
    path = write_megatron(tmp_path / "corpus_text_document", docs, dtype)
    stream = load_token_rows(DataConfig(path=path, seq_len=32))
    flat = np.concatenate([np.asarray(d) for d in docs])
    assert np.array_equal(stream.rows, flat[: len(flat) // 32 * 32].reshape(-1, 32))
    assert "Megatron indexed" in stream.description

    class Rows:
        def __init__(self) -> None:
            self.ids, self.targets, self.positions = [], [], []

        def add(self, ids, targets, positions) -> None:
            self.ids.append(ids), self.targets.append(targets), self.positions.append(positions)

    want = Rows()
    counts = pack((Example(d, None) for d in docs), 32, "documents", 0, want)
    cfg = DataConfig(path=path, seq_len=32, packing="documents", cache_dir=str(tmp_path / "cache"))
    for note in ("(built in", "(read)"):
        packed = load_token_rows(cfg)
        assert note in packed.cache_note
        assert np.array_equal(np.asarray(packed.rows, dtype=np.int64), np.array(want.ids))
        assert np.array_equal(np.asarray(packed.targets), np.array(want.targets))
        assert np.array_equal(np.asarray(packed.positions, dtype=np.int64), np.array(want.positions))
        assert packed.examples == counts.examples == 200 and packed.vocab_size is None


def test_a_bin_whose_idx_is_not_megatron_s_is_one_line(tmp_path):
    np.arange(16, dtype=np.uint16).tofile(tmp_path / "x.bin")
    (tmp_path / "x.idx").write_bytes(b"not an index at all, really")
    with pytest.raises(ConfigError, match=r"x.idx is not a Megatron index \(no MMIDIDX header\)"):
        load_token_rows(DataConfig(path=str(tmp_path / "x.bin"), seq_len=4))


def test_a_token_file_s_id_range_is_read_once_then_kept(tmp_path, monkeypatch):
    """The vocabulary check reads a pre-tokenised file once (plain reads, not mapped into the rank) and keeps its
    smallest and largest id in the data cache: a restart reads nothing; a file rewritten is read again."""
    import bigtrain.data.sources as sources

    path = tmp_path / "corpus.bin"
    np.arange(4096, dtype=np.uint16).tofile(path)
    cache = tmp_path / "cache"
    reads = []
    real = np.fromfile
    monkeypatch.setattr(sources.np, "fromfile", lambda *a, **k: reads.append(1) or real(*a, **k))
    data = load_token_rows(DataConfig(path=str(path), seq_len=64))
    check_vocabulary(data, 5000, str(path), cache_dir=cache)
    assert reads and [p.name.split("-")[0] for p in cache.iterdir() if not p.name.startswith(".")] == ["ids"]
    reads.clear()
    check_vocabulary(data, 5000, str(path), cache_dir=cache)
    assert reads == []
    with pytest.raises(ConfigError, match=r"token id 4000 \(row 62, position 32\) outside the model's vocabulary"):
        check_vocabulary(data, 4000, str(path), cache_dir=cache)
