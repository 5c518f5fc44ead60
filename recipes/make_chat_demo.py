"""``python recipes/make_chat_demo.py FOLDER``: what the README's chat fine-tuning walk-through starts from, made
offline in a second. With your own model and data, skip it and point the recipe at them.

- FOLDER/base: a tiny Llama (2 blocks, hidden 64) saved with ``save_pretrained``, with a tokenizer folder beside its
  weights: bigtrain's byte-level tokenizer in HF form (259 ids) with a ChatML chat template, as an instruct model
  ships one;
- FOLDER/train.jsonl (2000 conversations) and FOLDER/eval.jsonl (100): ``{"messages": [...]}`` records of the
  built-in chat corpus (a short story, then questions about it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from bigtrain.data.builtin import builtin_records
from bigtrain.data.tokenizer import save_byte_tokenizer


def main(folder: str) -> None:
    root = Path(folder)
    config = AutoConfig.for_model(
        "llama",
        vocab_size=259,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=256,
        pad_token_id=256,
    )
    torch.manual_seed(0)  # the same demo model every time
    AutoModelForCausalLM.from_config(config).save_pretrained(root / "base")
    save_byte_tokenizer(root / "base")
    records = builtin_records("chat", num_records=2100, seed=7)
    for name, part in (("train", records[:2000]), ("eval", records[2000:])):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    print(f"wrote {root / 'base'} (model + chat tokenizer), {root / 'train.jsonl'} and {root / 'eval.jsonl'}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "chat_demo")
