import json

import numpy as np
import pytest
from helpers import save_rows, save_word_tokenizer

from bigtrain.config.schema import DataConfig
from bigtrain.data.order import GlobalOrder
from bigtrain.data.sources import load_token_rows
from bigtrain.data.tokenizer import ByteTokenizer
from bigtrain.errors import ConfigError


def test_unshuffled_step_k_is_rows_kB_to_k1B():
    order = GlobalOrder(num_rows=100, global_batch_size=8, shuffle=False, seed=0)
    assert order.global_batch(3).tolist() == list(range(24, 32))
    # wraps into the next epoch
    assert order.global_batch(12).tolist() == [96, 97, 98, 99, 0, 1, 2, 3]


@pytest.mark.parametrize("shuffle", [False, True])
def test_samples_of_a_step_do_not_depend_on_the_plan(shuffle):
    order = GlobalOrder(num_rows=50, global_batch_size=16, shuffle=shuffle, seed=7)
    for step in range(6):
        expected = sorted(order.global_batch(step).tolist())
        for dp, mb in [(1, 16), (1, 2), (2, 1), (2, 4), (4, 2), (8, 1)]:
            parts = [order.micro_batches(step, r, dp, mb) for r in range(dp)]
            assert all(p.shape == (16 // dp // mb, mb) for p in parts)
            assert sorted(np.concatenate([p.ravel() for p in parts]).tolist()) == expected


def test_shuffle_is_a_seeded_permutation_per_epoch():
    a = GlobalOrder(num_rows=32, global_batch_size=32, shuffle=True, seed=1)
    b = GlobalOrder(num_rows=32, global_batch_size=32, shuffle=True, seed=1)
    assert a.global_batch(0).tolist() == b.global_batch(0).tolist()
    assert sorted(a.global_batch(0).tolist()) == list(range(32))
    assert a.global_batch(0).tolist() != a.global_batch(1).tolist()  # a new permutation each epoch


def test_jsonl_and_txt_are_packed_with_eos(tmp_path):
    docs = ["hello world", "second document here", "third"]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
    rows = load_token_rows(DataConfig(path=str(tmp_path / "d.jsonl"), seq_len=8))
    stream = [t for d in docs for t in [*d.encode(), ByteTokenizer.eos_id]]
    assert rows.rows.shape == (len(stream) // 8, 8)
    assert rows.rows.ravel().tolist() == stream[: rows.rows.size]
    (tmp_path / "d.txt").write_text("abcdefghij" * 3)
    assert load_token_rows(DataConfig(path=str(tmp_path / "d.txt"), seq_len=10)).rows.shape == (3, 10)


def test_hf_tokenizer_folder(tmp_path):
    save_word_tokenizer(tmp_path / "tok")
    (tmp_path / "d.jsonl").write_text('{"text": "hello world"}\n{"text": "world hello"}\n')
    rows = load_token_rows(DataConfig(path=str(tmp_path / "d.jsonl"), seq_len=3, tokenizer=str(tmp_path / "tok")))
    assert rows.rows.tolist() == [[2, 3, 0], [3, 2, 0]]
    assert rows.vocab_size == 4


def test_builtin_corpus_is_deterministic():
    a = load_token_rows(DataConfig(path="builtin:stories", seq_len=64))
    b = load_token_rows(DataConfig(path="builtin:stories", seq_len=64))
    assert np.array_equal(a.rows, b.rows) and a.rows.shape[0] > 1000


@pytest.mark.parametrize(
    "cfg, expected",
    [
        (DataConfig(path="missing.npy"), "data.path='missing.npy' does not exist"),
        (DataConfig(path="builtin:wiki", seq_len=8), "builtin:wiki is not a built-in corpus"),
        (DataConfig(path="builtin:stories"), "data.seq_len is required"),
    ],
)
def test_bad_data(cfg, expected):
    with pytest.raises(ConfigError, match=expected):
        load_token_rows(cfg)


def test_npy_width_must_match_seq_len(tmp_path):
    save_rows(tmp_path / "r.npy", np.zeros((4, 9), dtype=np.int32))
    with pytest.raises(ConfigError, match="data.seq_len=8 does not match the width 9"):
        load_token_rows(DataConfig(path=str(tmp_path / "r.npy"), seq_len=8))
    save_rows(tmp_path / "f.npy", np.zeros((4, 9), dtype=np.float32))
    with pytest.raises(ConfigError, match="must be integer ids"):
        load_token_rows(DataConfig(path=str(tmp_path / "f.npy")))


def test_a_resume_onto_another_world_size_mid_epoch_reads_every_row_once(tmp_path):
    """Steps 0-4 on 2 ranks (micro-batch 2, accumulation 2), then a resume at step 5 on 4 ranks (micro-batch 1, no
    accumulation), shuffled: the epoch's rows are each read exactly once."""
    import torch

    from bigtrain.data.loader import StepLoader

    rows = 96
    ids = np.repeat(np.arange(rows, dtype=np.int64)[:, None], 4, axis=1)
    np.save(tmp_path / "rows.npy", ids)
    data = load_token_rows(DataConfig(path=str(tmp_path / "rows.npy")))
    order = GlobalOrder(rows, 8, shuffle=True, seed=5)
    seen = []
    for step in range(12):  # 12 steps of 8 rows: one epoch
        ranks, micro = (2, 2) if step < 5 else (4, 1)
        for rank in range(ranks):
            loader = StepLoader(data, rank, ranks, micro, torch.device("cpu"), order=order)
            seen += [int(r) for m in loader(step).micro_batches for r in m.input_ids[:, 0]]
    assert sorted(seen) == list(range(rows))


def test_the_shuffled_order_is_numpy_s_permutation_held_in_four_bytes_a_row():
    """The epoch's permutation is the one ``Generator.permutation`` draws (runs and checkpoints keep their order),
    held as int32 (4 bytes a row per rank, not 8); file order keeps no array at all."""
    import numpy as np

    from bigtrain.data.order import GlobalOrder

    rows, batch = 100_003, 64
    order = GlobalOrder(rows, batch, shuffle=True, seed=11)
    step = 1_570  # crosses into epoch 1
    positions = np.arange(step * batch, (step + 1) * batch)
    epochs, within = np.divmod(positions, rows)
    want = np.array([np.random.default_rng(11 + e).permutation(rows)[w] for e, w in zip(epochs, within, strict=True)])
    np.testing.assert_array_equal(order.global_batch(step), want)
    assert all(p.dtype == np.int32 for p in order._perms.values())
    plain = GlobalOrder(rows, batch, shuffle=False, seed=11)
    np.testing.assert_array_equal(plain.global_batch(step), within)
    assert not plain._perms
