"""Embedding data (``model.task: embedding``): records of an anchor, its positive and optional negatives read once into
the data cache, micro-batches in column blocks cut to their longest text, and each bad input refused in one line that
names the key, the record and what would work."""

from __future__ import annotations

import json

import pytest
import torch

from bigtrain.config.schema import DataConfig
from bigtrain.data.text_pairs import load_text_pairs
from bigtrain.errors import ConfigError


def _load(tmp_path, records: list[dict], seq_len: int = 16):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = DataConfig(path=str(path), seq_len=seq_len, cache_dir=str(tmp_path / "cache"))
    return load_text_pairs(cfg, "data.path", str(path), None)


def test_a_micro_batch_is_anchors_then_positives_then_negatives_cut_to_the_longest(tmp_path):
    records = [{"anchor": "ab", "positive": "cde", "negative": ["f", "ghij"]}, {"anchor": "k", "positive": "lm",
               "negative": ["n", "o"]}]  # fmt: skip
    data = _load(tmp_path, records)
    assert (data.count, data.columns) == (2, 4)
    batch = data.micro_batch(torch.arange(2).numpy())
    texts = ["ab", "k", "cde", "lm", "f", "n", "ghij", "o"]  # column by column: the loss reads blocks of 2
    assert batch.input_ids.shape == (8, 4) and batch.columns == 4
    for row, text in enumerate(texts):
        assert batch.input_ids[row, : len(text)].tolist() == list(text.encode())
        assert batch.attention_mask[row].sum() == len(text)
    assert batch.labels.tolist() == [0, 0]


def test_texts_longer_than_seq_len_are_cut_and_counted(tmp_path):
    data = _load(tmp_path, [{"anchor": "a" * 20, "positive": "b"}, {"anchor": "c", "positive": "d"}], seq_len=8)
    assert data.truncated == 1 and "1 text(s) cut at data.seq_len=8" in data.description
    assert data.micro_batch(torch.arange(1).numpy()).input_ids.shape == (2, 8)


def test_a_record_without_a_positive_is_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, [{"anchor": "a", "positive": "b"}, {"anchor": "c", "answer": "d"}])
    said = str(e.value)
    assert "\n" not in said and "no 'positive' text" in said and "['anchor', 'answer']" in said
    assert "line 2" in said or "record 1" in said, said


def test_records_with_different_numbers_of_negatives_are_one_line(tmp_path):
    records = [
        {"anchor": "a", "positive": "b", "negative": ["x", "y"]},
        {"anchor": "c", "positive": "d", "negative": "z"},
    ]
    with pytest.raises(ConfigError, match=r"1 negative\(s\) where the records before have 2; every record needs the "):
        _load(tmp_path, records)


def test_a_global_batch_too_small_for_in_batch_negatives_is_one_line():
    from bigtrain.config.schema import RecipeConfig, TrainConfig
    from bigtrain.objectives.contrastive import check

    with pytest.raises(ConfigError, match=r"train.global_batch_size=1: in-batch negatives need at least 2 anchors"):
        check(RecipeConfig(train=TrainConfig(global_batch_size=1, objective="contrastive")))
    with pytest.raises(ConfigError, match=r"train.contrastive_temperature=0.0 must be above 0"):
        check(RecipeConfig(train=TrainConfig(global_batch_size=8, contrastive_temperature=0.0)))


def test_a_cut_text_keeps_its_closing_special_token_as_sentence_transformers_cuts(tmp_path):
    """A BERT-style tokenizer ([CLS] text [SEP]): a text longer than seq_len is cut by the tokenizer's truncation,
    its [SEP] kept last, as SentenceTransformer cuts it when it embeds."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: 4 + i for i, w in enumerate("abcdefgh")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                            unk_token="[UNK]").save_pretrained(tmp_path / "tok")  # fmt: skip
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"anchor": "a b c d e f", "positive": "g h"}) + "\n" + json.dumps({"anchor": "a", "positive": "b"}) + "\n")
    cfg = DataConfig(path=str(path), seq_len=5, cache_dir=str(tmp_path / "cache"))
    data = load_text_pairs(cfg, "data.path", str(path), str(tmp_path / "tok"))
    batch = data.micro_batch(torch.arange(1).numpy())
    assert batch.input_ids[0].tolist() == [2, 4, 5, 6, 3]  # [CLS] a b c [SEP]
    assert batch.input_ids[1, :4].tolist() == [2, 10, 11, 3] and data.truncated == 1
