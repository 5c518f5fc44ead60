"""Chat, instruction and HF-dataset data: what is trained on, how records become rows, and where they come from."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cases import TINY_LLAMA
from helpers import hf_assistant_mask, save_chat_tokenizer

from bigtrain.config.schema import DataConfig
from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.data.sources import load_token_rows
from bigtrain.errors import ConfigError
from bigtrain.losses.causal_lm import labeled_loss_sum

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "two plus two?"},
        {"role": "assistant", "content": "four"},
        {"role": "user", "content": "and three?"},
        {"role": "assistant", "content": "five"},
    ],
    [{"role": "user", "content": "name a colour"}, {"role": "assistant", "content": "blue"}],
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return save_chat_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def chat_rows(tmp_path, tok, packing, seq_len=128):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in CONVERSATIONS])
    return load_token_rows(DataConfig(path=str(path), seq_len=seq_len, tokenizer=str(tok), packing=packing))


def test_chat_trains_on_the_assistant_tokens_that_transformers_marks(tmp_path, tok):
    data = chat_rows(tmp_path, tok, "pad")
    assert data.rows.shape == (3, 128) and data.positions is None
    for row, messages in enumerate(CONVERSATIONS):
        ids, mask = hf_assistant_mask(tok, messages)
        n = len(ids)
        assert data.rows[row, :n].tolist() == ids
        assert data.targets[row, :n].tolist() == [bool(m) for m in mask]
        assert not data.targets[row, n:].any()  # padding
        labels = data.micro_batch(np.array([row])).labels[0]
        expected = [ids[t + 1] if mask[t + 1] else IGNORE_INDEX for t in range(n - 1)]
        assert labels[: n - 1].tolist() == expected and (labels[n - 1 :] == IGNORE_INDEX).all()


def test_packed_documents_do_not_see_each_other(tmp_path, tok):
    """A packed row's loss is the sum of each conversation's loss computed alone (its own forward, positions from
    0): attention and positions stay inside each document."""
    from transformers import AutoModelForCausalLM

    from bigtrain.config.hf import hf_config_from_dict

    data = chat_rows(tmp_path, tok, "documents", seq_len=200)
    assert data.rows.shape[0] == 1  # all three fit one row
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config_from_dict({**TINY_LLAMA, "vocab_size": 259}))
    batch = data.micro_batch(np.array([0]))
    packed = labeled_loss_sum(model(**batch.model_inputs(), use_cache=False).logits, batch.labels)
    alone = 0.0
    for messages in CONVERSATIONS:
        ids, mask = hf_assistant_mask(tok, messages)
        logits = model(input_ids=torch.tensor([ids])).logits[0]
        keep = torch.tensor(mask[1:], dtype=torch.bool)
        alone += torch.nn.functional.cross_entropy(logits[:-1][keep], torch.tensor(ids[1:])[keep], reduction="sum")
    torch.testing.assert_close(packed, alone, rtol=1e-6, atol=0)
    # the same row without position ids, documents attending to each other: 100x beyond the tolerance (measured 4e-4)
    mixed = labeled_loss_sum(model(input_ids=batch.input_ids).logits, batch.labels)
    assert abs(float(mixed.detach() / alone.detach()) - 1) > 1e-4


def test_documents_packing_fills_rows_without_splitting_a_record(tmp_path, tok):
    lengths = [len(hf_assistant_mask(tok, m)[0]) for m in CONVERSATIONS]
    seq_len = lengths[0] + lengths[1]  # the first two fill a row exactly, the third starts the next
    data = chat_rows(tmp_path, tok, "documents", seq_len=seq_len)
    assert data.rows.shape == (2, seq_len)
    assert data.positions[0].tolist() == [*range(lengths[0]), *range(lengths[1])]
    assert data.positions[1, : lengths[2]].tolist() == list(range(lengths[2]))
    assert not data.targets[1, lengths[2] :].any()


def test_truncation_is_counted_and_stream_keeps_the_masks(tmp_path, tok):
    lengths = [len(hf_assistant_mask(tok, m)[0]) for m in CONVERSATIONS]
    data = chat_rows(tmp_path, tok, "pad", seq_len=30)
    assert f"{sum(n > 30 for n in lengths)} truncated to seq_len" in data.description
    stream = chat_rows(tmp_path, tok, "stream", seq_len=16)
    assert stream.positions is None and stream.targets is not None


def test_instruction_trains_on_the_completion_and_its_end(tmp_path, tok):
    path = write_jsonl(tmp_path / "inst.jsonl", [{"prompt": "Q: 2+2?\nA:", "completion": " 4"}])
    data = load_token_rows(DataConfig(path=str(path), seq_len=16, tokenizer=str(tok), packing="pad"))
    prompt = list(b"Q: 2+2?\nA:")
    assert data.rows[0, :13].tolist() == [*prompt, *b" 4", 256]
    assert data.targets[0].tolist() == [False] * len(prompt) + [True] * 3 + [False] * 3


def test_auto_format_and_errors(tmp_path, tok):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[0]}])
    with pytest.raises(ConfigError, match="built-in byte tokenizer has none"):
        load_token_rows(DataConfig(path=str(path), seq_len=64))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "robot", "content": "x"}]}])
    with pytest.raises(ConfigError, match="line 1: message 0 must be"):
        load_token_rows(DataConfig(path=str(bad), seq_len=64, tokenizer=str(tok)))
    no_answer = write_jsonl(tmp_path / "q.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(ConfigError, match="no chat example has a token to train on"):
        load_token_rows(DataConfig(path=str(no_answer), seq_len=64, tokenizer=str(tok)))
    half = write_jsonl(tmp_path / "i.jsonl", [{"prompt": "a"}])
    with pytest.raises(ConfigError, match="line 1 has no string field 'text'"):
        load_token_rows(DataConfig(path=str(half), seq_len=64))
    with pytest.raises(ConfigError, match="needs string fields 'prompt' and 'completion'"):
        load_token_rows(DataConfig(path=str(half), seq_len=64, format="instruction"))


def test_local_hf_datasets_give_the_same_rows_as_jsonl(tmp_path, tok):
    import datasets

    records = [{"messages": m} for m in CONVERSATIONS]
    cfg = dict(seq_len=64, tokenizer=str(tok), packing="documents")
    expected = load_token_rows(DataConfig(path=str(write_jsonl(tmp_path / "c.jsonl", records)), **cfg))
    ds = datasets.Dataset.from_list(records)
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "pq").mkdir()
    ds.select([0, 1]).to_parquet(str(tmp_path / "pq" / "part-0.parquet"))
    ds.select([2]).to_parquet(str(tmp_path / "pq" / "part-1.parquet"))
    for path in ("saved", "saved/*.arrow", "dict", "pq", "pq/*.parquet", "pq/part-0.parquet"):
        got = load_token_rows(DataConfig(path=str(tmp_path / path), **cfg))
        n = 2 if path.endswith("part-0.parquet") else 3
        assert f": {n} examples" in got.description, path
        if n == 3:
            assert np.array_equal(got.rows, expected.rows) and np.array_equal(got.targets, expected.targets), path
    with pytest.raises(ConfigError, match="has splits train, test but not data.split='validation'"):
        load_token_rows(DataConfig(path=str(tmp_path / "dict"), split="validation", **cfg))
    with pytest.raises(ConfigError, match="matches no file"):
        load_token_rows(DataConfig(path=str(tmp_path / "none*.parquet"), **cfg))
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.parquet").write_bytes((tmp_path / "pq" / "part-1.parquet").read_bytes())
    write_jsonl(tmp_path / "mixed" / "b.jsonl", records)
    with pytest.raises(ConfigError, match="must hold one kind"):
        load_token_rows(DataConfig(path=str(tmp_path / "mixed"), **cfg))


def test_the_packing_check_measures_each_family():
    """Llama, Qwen2 and GPT-2 keep packed records apart (the restarted position ids reach their masks); OPT's
    attention does not, so documents packing is refused for it; flash attention cannot be checked on a CPU."""
    from cases import TINY_MODELS

    from bigtrain.config.hf import hf_config_from_dict
    from bigtrain.models.checks import check_packed_attention

    for arch in ("llama-tied", "qwen2-untied", "gpt2"):
        assert check_packed_attention(hf_config_from_dict(dict(TINY_MODELS[arch])), "sdpa") is None, arch
    opt = hf_config_from_dict({"model_type": "opt", "vocab_size": 128})
    with pytest.raises(ConfigError, match="lets a packed record attend to the one before it"):
        check_packed_attention(opt, "eager")
    assert "not checked on this machine" in check_packed_attention(opt, "flash_attention_2")


def test_review_cases_jsonl_lines_template_errors_split_and_old_recipes(tmp_path, tok):
    # a JSON string may hold U+2028 raw (json.dumps(ensure_ascii=False) writes it): still one record, one line
    path = tmp_path / "sep.jsonl"
    path.write_text(json.dumps({"text": "a\u2028b"}, ensure_ascii=False) + "\n" + json.dumps({"text": "c"}) + "\n")
    assert "text: 2 examples" in load_token_rows(DataConfig(path=str(path), seq_len=4)).description
    # a template that refuses a conversation is one line naming the record
    from transformers import AutoTokenizer

    strict = tmp_path / "strict"
    hf = AutoTokenizer.from_pretrained(tok)
    hf.chat_template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations must start with a user turn') }}"
        "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    hf.save_pretrained(strict)
    bad = write_jsonl(tmp_path / "b.jsonl", [{"messages": CONVERSATIONS[0]}, {"messages": CONVERSATIONS[0][1:]}])
    with pytest.raises(
        ConfigError, match="line 2: the chat template refuses this conversation .*must start with a user"
    ):
        load_token_rows(DataConfig(path=str(bad), seq_len=64, tokenizer=str(strict)))
    # data.split names a split of a saved DatasetDict; data files are one split
    import datasets

    datasets.Dataset.from_list([{"text": "hello"}] * 4).to_parquet(str(tmp_path / "d.parquet"))
    with pytest.raises(ConfigError, match="data.split='test' applies to a saved DatasetDict folder"):
        load_token_rows(DataConfig(path=str(tmp_path / "d.parquet"), seq_len=4, split="test"))


def test_a_recipe_saved_before_the_fine_tuning_keys_still_resumes():
    """A checkpoint's recipe.yaml written before data.format, train.eval_every, ... existed holds none of them: they
    had their defaults, so the same recipe resumes; evaluation and logging settings may change on resume."""
    from bigtrain.checkpoint.run_dir import recipe_differences
    from bigtrain.config.load import recipe_to_dict
    from bigtrain.config.schema import RecipeConfig

    cfg = RecipeConfig()
    saved = recipe_to_dict(cfg)
    for key in ("format", "packing", "split", "eval_path", "eval_fraction"):
        del saved["data"][key]
    del saved["train"]["eval_every"], saved["train"]["log_to"]
    assert recipe_differences(saved, cfg) == []
    cfg.train.eval_every, cfg.train.log_to, cfg.data.eval_path = 5, "tensorboard", "held.jsonl"
    assert recipe_differences(saved, cfg) == []
    cfg.data.packing = "pad"  # changes the rows trained on: not a resume
    assert recipe_differences(saved, cfg) == ["data.packing: None -> 'pad'"]


def test_a_recipe_saved_when_the_weighting_scheme_defaulted_to_none_still_resumes():
    """train.weighting_scheme was "none" in every recipe.yaml before its default became the family's (unset)."""
    from bigtrain.checkpoint.run_dir import recipe_differences
    from bigtrain.config.load import recipe_to_dict
    from bigtrain.config.schema import RecipeConfig

    cfg = RecipeConfig()
    saved = recipe_to_dict(cfg)
    saved["train"]["weighting_scheme"] = "none"
    assert recipe_differences(saved, cfg) == []
    saved["train"]["weighting_scheme"] = "cosmap"  # a scheme the run chose: not the same run
    assert recipe_differences(saved, cfg) == ["train.weighting_scheme: 'cosmap' -> None"]
