"""The trained model comes back as a HuggingFace folder that ``transformers`` loads on one CPU process.

A 2-rank FSDP2 job trains a saved model for 3 steps and writes its trained parameters, gathered from the live engine,
next to its outputs (``train_and_save.py``). The folder the run writes at the end (``output_dir/model``) and the one
``bigtrain export-model`` writes from the checkpoint must give the same logits as those parameters, for a tied and an
untied architecture; the LM head is stored only when it is its own parameter.
"""

from __future__ import annotations

import json

import pytest
import torch
from cases import TINY_LLAMA, TINY_MODELS
from helpers import (
    REPO,
    learnable_rows,
    recipe_dict,
    run_cli,
    run_torchrun,
    save_rows,
    save_tiny_model,
    save_word_tokenizer,
    write_recipe,
)

WORKER = REPO / "tests" / "distributed" / "train_and_save.py"
LOGITS_ATOL = 1e-5


def logits(model, batch: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=batch).logits


def load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)


@pytest.mark.parametrize(
    "arch, parallel",
    [  # the full tier adds an untied family and a tp plan with loss parallelism
        ("llama-tied", {}),
        pytest.param("qwen2-untied", {}, marks=pytest.mark.full),
        pytest.param("llama-4layers", {"tp": 2, "loss_parallel": True}, marks=pytest.mark.full),
    ],
    ids=["llama-tied-fsdp2", "qwen2-untied-fsdp2", "llama-tp2-loss_parallel"],
)
def test_final_model_and_export_give_the_trained_logits(arch, parallel, tmp_path):
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    base = save_tiny_model(tmp_path / "base", spec=TINY_MODELS[arch])
    rows = learnable_rows(16, 17)
    out = tmp_path / "out"
    recipe = recipe_dict(
        out,
        save_rows(tmp_path / "rows.npy", rows),
        base,
        train={"steps": 3, "global_batch_size": 4, "lr": 1e-2},
        parallel={"backend": "fsdp2", **parallel},
        checkpoint={"every": 0},
    )
    path = write_recipe(tmp_path / "recipe.yaml", recipe)
    proc = run_torchrun([str(WORKER), str(path), str(tmp_path / "trained.pt")], nproc=2, module=False)
    assert proc.returncode == 0, proc.stderr[-3000:]

    trained = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base), dtype=torch.float32)
    trained.load_state_dict(torch.load(tmp_path / "trained.pt"))
    batch = torch.from_numpy(rows[:4])
    expected = logits(trained, batch)
    assert not torch.allclose(expected, logits(load(base), batch), atol=1e-3)  # training changed the model

    proc = run_cli(["export-model", str(out / "checkpoints" / "step_3"), "-o", str(tmp_path / "exported")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    for folder in (out / "model", tmp_path / "exported"):
        torch.testing.assert_close(logits(load(folder), batch), expected, rtol=0, atol=LOGITS_ATOL)
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            tied = TINY_MODELS[arch].get("tie_word_embeddings", True)
            assert ("lm_head.weight" in f.keys()) == (not tied)  # a tied head is stored once
        assert (folder / "generation_config.json").is_file() == (base / "generation_config.json").is_file()


def test_export_writes_shards_with_an_index_and_the_tokenizer(tmp_path):
    """A small shard limit splits the weights over several files (HF's sharded layout); the recipe's tokenizer
    travels with the checkpoint into the export."""
    from transformers import AutoTokenizer

    base = save_tiny_model(tmp_path / "base")
    save_word_tokenizer(tmp_path / "tok")
    (tmp_path / "d.jsonl").write_text('{"text": "hello world hello"}\n' * 64)
    out = tmp_path / "out"
    recipe = recipe_dict(
        out,
        tmp_path / "d.jsonl",
        base,
        data={"tokenizer": str(tmp_path / "tok"), "seq_len": 8},
        train={"steps": 2, "global_batch_size": 2},
        checkpoint={"save_final_model": False},
    )
    proc = run_cli(["train", str(write_recipe(tmp_path / "recipe.yaml", recipe))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (out / "model").exists()  # opted out

    from bigtrain.checkpoint.export import export_model

    export_model(out, tmp_path / "sharded", max_shard_bytes=40_000)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 2 and all((tmp_path / "sharded" / f).is_file() for f in files)
    batch = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 8))
    export_model(out, tmp_path / "single")
    torch.testing.assert_close(logits(load(tmp_path / "sharded"), batch), logits(load(tmp_path / "single"), batch))
    tok = AutoTokenizer.from_pretrained(tmp_path / "sharded", local_files_only=True)
    assert tok.encode("hello world", add_special_tokens=False) == [2, 3]
