"""An embedding model's final folder is a sentence-transformers model: ``SentenceTransformer(folder)`` embeds a text
as the run's own pooling of the trained model does. A BERT trained fully on 2 ranks (mean pooling, a whole model
folder), whose last evaluation equals the held-out retrieval computed by hand from the folder, and a decoder with LoRA
adapters on one rank (the last token pooled, a peft adapter folder over its base)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import recipe_dict, run_cli, write_recipe

from bigtrain.losses.contrastive import pool

pytestmark = pytest.mark.full

BERT = {"model_type": "bert", "vocab_size": 320, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 128}  # fmt: skip
LLAMA = {"model_type": "llama", "vocab_size": 320, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}  # fmt: skip
TEXTS = ["where is the fox 12?", "the fox 12 sits by the river and waits", "a"]
SEED, RECORDS, HELD = 7, 4000, 200  # builtin:retrieval's 4,000 records, 5% held out by the recipe's seed


def _base(folder, spec):
    from transformers import AutoConfig, AutoModel

    spec = dict(spec)
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.for_model(spec.pop("model_type"), **spec)).save_pretrained(folder)
    return folder


def _train(tmp_path, base, method: str, ranks: int):
    train = {"steps": 3, "global_batch_size": 8, "lr": 1e-3, "method": method, "seed": SEED}
    data = {"seq_len": 64, "eval_fraction": HELD / RECORDS}
    sections = dict(data=data, train=train, parallel={"backend": "ddp", "micro_batch_size": 2})
    if method == "lora":
        sections["lora"] = {"r": 4, "alpha": 8}
    recipe = recipe_dict(tmp_path / "run", "builtin:retrieval", base, **sections)
    recipe["model"]["task"] = "embedding"
    proc = run_cli(["train", str(write_recipe(tmp_path / "recipe.yaml", recipe)), "--nproc", str(ranks)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return tmp_path / "run" / ("adapter" if method == "lora" else "model")


def _by_hand(model, folder, pooling: str) -> torch.Tensor:
    """The run's pooling of the model's last hidden states, on the folder's tokenizer's ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = []
    with torch.no_grad():
        for text in TEXTS:
            batch = tokenizer([text], return_tensors="pt")
            hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            out.append(pool(hidden, batch["attention_mask"], pooling)[0])
    return torch.stack(out)


@pytest.mark.parametrize("kind", ["bert-full", "llama-lora"])
def test_sentence_transformers_embeds_as_the_trained_model(kind, tmp_path):
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    spec, method, pooling = (BERT, "full", "mean") if kind == "bert-full" else (LLAMA, "lora", "last_token")
    base = _base(tmp_path / "base", spec)
    folder = _train(tmp_path, base, method, ranks=2 if kind == "bert-full" else 1)
    loaded = SentenceTransformer(str(folder), device="cpu")
    assert loaded[1].pooling_mode == pooling.replace("_", "")
    got = loaded.encode(TEXTS, convert_to_tensor=True)
    untrained = AutoModel.from_pretrained(base).eval()
    if method == "lora":
        trained = PeftModel.from_pretrained(AutoModel.from_pretrained(base), folder).eval()
    else:
        trained = AutoModel.from_pretrained(folder).eval()
    torch.testing.assert_close(got, _by_hand(trained, folder, pooling), rtol=1e-5, atol=1e-5)
    assert (got - _by_hand(untrained, folder, pooling)).abs().max() > 1e-3  # the trained weights, not the base's
    if kind == "bert-full":
        _last_evaluation_is_the_folder_s_retrieval(loaded, tmp_path / "run")


def _last_evaluation_is_the_folder_s_retrieval(model, run) -> None:
    """Each held-out question's story ranked among all 200 held-out stories by the folder's embeddings (cosine), as
    accuracy@1, MRR@10 and recall@10: the run's last evaluation, its 200 anchors gathered from 2 ranks."""
    from bigtrain.data.builtin import builtin_records

    records = builtin_records("retrieval", num_records=RECORDS)
    held = np.sort(np.random.default_rng(SEED).choice(RECORDS, size=HELD, replace=False))
    anchors = model.encode([records[i]["anchor"] for i in held], convert_to_tensor=True, normalize_embeddings=True)
    stories = model.encode([records[i]["positive"] for i in held], convert_to_tensor=True, normalize_embeddings=True)
    scores = anchors @ stories.T
    rank = (scores > scores.diagonal()[:, None]).sum(1) + 1
    by_hand = {
        "eval_accuracy": float((rank == 1).float().mean()),
        "eval_mrr_at_10": float(torch.where(rank <= 10, 1.0 / rank, 0.0).mean()),
        "eval_recall_at_10": float((rank <= 10).float().mean()),
    }
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["eval_anchors"] == HELD
    for key, value in by_hand.items():  # padding in other batches moves a score by ~1e-7: one tie may turn
        assert last[key] == pytest.approx(value, abs=1.5 / HELD), (key, last[key], value)
