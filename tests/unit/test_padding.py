"""Right-padded rows (``data.packing: pad``) are cut per micro-batch after its longest row, to a multiple of 8, as
the HF Trainer's and TRL's collators pad; plans that need one length keep the full row (train/padding.py). That the
loss is unchanged is tests/distributed/test_masked_equivalence.py's pad case."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bigtrain.config.plan import Plan
from bigtrain.config.schema import DataConfig, TrainConfig
from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.data.loader import StepLoader
from bigtrain.data.order import GlobalOrder
from bigtrain.data.sources import load_token_rows
from bigtrain.data.tokenizer import save_byte_tokenizer
from bigtrain.train.padding import trim_multiple

PLAN = Plan(
    backend="fsdp2", zero_stage=3, grad_reduce="every_micro_step", dp_replicate=1, dp_shard=2, tp=1, pp=1,
    pp_schedule="1f1b", activation_checkpointing="none", micro_batch_size=2, offload_optimizer=False,
    offload_params=False,
)  # fmt: skip


@pytest.fixture
def padded(tmp_path):
    lengths = [5, 30, 12, 3, 7, 9, 41, 2]  # instruction records of these many completion words
    with (tmp_path / "inst.jsonl").open("w") as f:
        for n in lengths:
            f.write(json.dumps({"prompt": "q", "completion": "a" * n}) + "\n")
    tok = str(save_byte_tokenizer(tmp_path / "tok"))
    cfg = DataConfig(path=str(tmp_path / "inst.jsonl"), tokenizer=tok, seq_len=128, packing="pad",
                     cache_dir=str(tmp_path / "cache"))  # fmt: skip
    return load_token_rows(cfg)


def test_a_micro_batch_of_padded_rows_is_cut_after_its_longest_row(padded):
    assert padded.padded
    order = GlobalOrder(padded.num_rows, 8, shuffle=False, seed=0)
    full = StepLoader(padded, 0, 1, 2, torch.device("cpu"), order=order)(0)
    cut = StepLoader(padded, 0, 1, 2, torch.device("cpu"), order=order, trim_to=8)(0)
    assert [m.input_ids.shape[1] for m in full.micro_batches] == [128] * 4
    widths = [m.input_ids.shape[1] for m in cut.micro_batches]
    # a row is the prompt (1 id), the completion and the end id; its last input predicts nothing: the longest row
    # of each micro-batch less one, rounded up to 8
    assert widths == [32, 16, 16, 48]
    assert cut.tokens == full.tokens  # the same predicted tokens: nothing but padding went
    for a, b in zip(full.micro_batches, cut.micro_batches, strict=True):
        width = b.input_ids.shape[1]
        assert torch.equal(a.input_ids[:, :width], b.input_ids) and torch.equal(a.labels[:, :width], b.labels)
        assert (a.labels[:, width:] == IGNORE_INDEX).all()


def test_plans_that_need_one_length_keep_the_full_row(padded):
    train = TrainConfig()
    assert trim_multiple(padded, PLAN, train, None) == 8
    assert trim_multiple(padded, PLAN, TrainConfig(fp8="tensorwise"), None) == 16
    assert trim_multiple(padded, PLAN.but(tp=3, dp_shard=1, sequence_parallel=True), train, None) == 24
    for plan in (PLAN.but(pp=2, dp_shard=1), PLAN.but(cp=2, dp_shard=1)):
        assert trim_multiple(padded, plan, train, None) == 0
    assert trim_multiple(padded, PLAN, TrainConfig(compile=True), None) == 0

    class Mixture:
        output_router_logits, router_aux_loss_coef = True, 0.01

    assert trim_multiple(padded, PLAN, train, Mixture()) == 0
    packed = load_token_rows(DataConfig(path="builtin:stories", seq_len=64))
    assert trim_multiple(packed, PLAN, train, None) == 0  # stream rows: nothing to cut
    assert np.asarray(packed.rows).shape[1] == 64
