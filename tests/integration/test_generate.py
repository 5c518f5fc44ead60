"""``bigtrain generate``: a trained run's model, its tokenizer (here the built-in byte tokenizer the run read its
text with, saved beside the model) and its chat template, without writing Python."""

from __future__ import annotations

import pytest
from cases import TINY_LLAMA
from helpers import recipe_dict, run_cli, write_recipe

pytestmark = pytest.mark.full


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    recipe = write_recipe(
        root / "recipe.yaml",
        recipe_dict(
            root / "out",
            "builtin:stories",
            {**TINY_LLAMA, "vocab_size": 320},  # the byte tokenizer's 257 ids, rounded up
            data={"seq_len": 32},
            train={"steps": 3, "global_batch_size": 4},
        ),
    )
    proc = run_cli(["train", str(recipe)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "out"


def test_a_run_s_model_continues_a_prompt_with_the_run_s_tokenizer(run):
    assert (run / "model" / "tokenizer.json").is_file()  # the byte tokenizer, saved as an HF tokenizer
    proc = run_cli(["generate", str(run), "--prompt", "Once upon a time", "--max-new-tokens", "8"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.endswith("\n") and len(proc.stdout) > 1  # 8 generated tokens (bytes), then the newline
    assert "Loading weights" not in proc.stderr


def test_chat_reads_prompts_from_stdin_one_answer_each(run):
    import subprocess
    import sys

    from helpers import REPO

    proc = subprocess.run(
        [sys.executable, "-m", "bigtrain", "generate", str(run / "model"), "--chat", "--max-new-tokens", "4"],
        input="Who went to the beach?\nWhat did Mia find?\n", capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("\n---\n") == 2 and proc.stdout.endswith("\n---\n")


def test_a_folder_without_a_model_is_one_line(tmp_path):
    proc = run_cli(["generate", str(tmp_path), "--prompt", "hi"])
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"bigtrain: error: {tmp_path} holds no model: give a run's output_dir (with model/ or adapter/, written at the "
        "end of a run), an HF model folder or a peft adapter folder; a checkpoint becomes one with bigtrain "
        "export-model"
    )


def test_a_lora_run_s_adapter_continues_a_prompt_on_its_base(tmp_path):
    """An adapter run ends in peft's folder (adapter/, the base named by its absolute path, the tokenizer beside
    it): generate loads the base, the adapter on it and that tokenizer, from another working directory."""
    import json
    import os
    import subprocess
    import sys

    from helpers import REPO, save_tiny_model, save_word_tokenizer

    base = save_word_tokenizer(save_tiny_model(tmp_path / "base"))
    text = tmp_path / "docs.jsonl"
    text.write_text("".join(json.dumps({"text": "hello world " * 20}) + "\n" for _ in range(20)))
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        recipe_dict(
            tmp_path / "out",
            text,
            base,
            data={"seq_len": 16},
            train={"steps": 2, "global_batch_size": 4, "method": "lora"},
        ),
    )
    proc = run_cli(["train", str(recipe)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / "adapter" / "adapter_config.json").is_file()
    proc = subprocess.run(
        [sys.executable, "-m", "bigtrain", "generate", str(tmp_path / "out"), "--prompt", "hello", "--max-new-tokens", "3"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a line in the base's own vocabulary (a tiny random model may end it at once with its end-of-text), nothing else
    assert proc.stdout.endswith("\n") and set(proc.stdout.split()) <= {"hello", "world"}, proc.stdout
    assert not proc.stderr.strip(), proc.stderr[-3000:]
