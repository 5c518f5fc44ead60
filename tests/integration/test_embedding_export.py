"""An embedding model's final folder is a sentence-transformers model: ``SentenceTransformer(folder)`` embeds a text
as the run's own pooling of the trained model does. A BERT trained fully (mean pooling, a whole model folder) and a
decoder with LoRA adapters (the last token pooled, a peft adapter folder over its base)."""

from __future__ import annotations

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


def _base(folder, spec):
    from transformers import AutoConfig, AutoModel

    spec = dict(spec)
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.for_model(spec.pop("model_type"), **spec)).save_pretrained(folder)
    return folder


def _train(tmp_path, base, method: str):
    train = {"steps": 3, "global_batch_size": 8, "lr": 1e-3, "method": method, "eval_every": 0}
    sections = dict(data={"seq_len": 64}, train=train, parallel={"backend": "ddp", "micro_batch_size": 4})
    if method == "lora":
        sections["lora"] = {"r": 4, "alpha": 8}
    recipe = recipe_dict(tmp_path / "run", "builtin:retrieval", base, **sections)
    recipe["model"]["task"] = "embedding"
    proc = run_cli(["train", str(write_recipe(tmp_path / "recipe.yaml", recipe))])
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
    folder = _train(tmp_path, base, method)
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
