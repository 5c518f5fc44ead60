"""What a fine-tuning user meets in the first hour (issue 12's "Found" list): each bad input is one line naming the
problem and what would work, before any process group; silent surprises are refused or said out loud.

Most cases run ``bigtrain train`` through the CLI's own ``main`` in this process (validation happens before any
process group exists, so nothing is started); the few that must train run as real processes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cases import TINY_MODELS
from helpers import recipe_dict, run_cli, save_rows, save_tiny_model, save_word_tokenizer, with_sections, write_recipe

SEQ = 17
BERT = dict(
    model_type="bert",
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)


@pytest.fixture
def rows_file(tmp_path):
    return save_rows(tmp_path / "rows.npy", num_rows=64, seq_len=SEQ)


def recipe(tmp_path, data_path, **sections):
    """The suite's recipe (2 steps of 8 sequences, fsdp2) with ``sections`` changed, written to a file."""
    base = recipe_dict(
        tmp_path / "out", data_path, train={"steps": 2, "global_batch_size": 8}, parallel={"backend": "fsdp2"}
    )
    return write_recipe(tmp_path / "recipe.yaml", with_sections(base, **sections))


def one_line(proc, expected: str, code: int = 2) -> None:
    """Exit code ``code``, no traceback, and the last line the error that says ``expected``."""
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bigtrain: error: ") and expected in last, last


def test_a_model_folder_trains_on_its_own_tokenizer(tmp_path):
    folder = save_word_tokenizer(save_tiny_model(tmp_path / "model"))
    text = tmp_path / "docs.jsonl"
    text.write_text("".join(json.dumps({"text": "hello world " * 20}) + "\n" for _ in range(20)))
    spec = recipe_dict(
        tmp_path / "out",
        text,
        folder,
        data={"seq_len": SEQ},
        train={"steps": 1, "global_batch_size": 8},
        checkpoint={"save_final_model": False},
    )
    path = write_recipe(tmp_path / "r.yaml", spec)
    proc = run_cli(["train", str(path)], timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"tokenizer {folder}" in proc.stderr  # the log says which tokenizer made the ids
    # a model.config model (no folder) keeps the built-in byte tokenizer
    from bigtrain.config.load import load_recipe

    assert load_recipe(recipe(tmp_path, text, data={"seq_len": SEQ})).data.tokenizer is None


@pytest.mark.parametrize("where", ["config", "folder"])
def test_an_encoder_is_refused_up_front(where, tmp_path, rows_file, cli_in_process):
    if where == "config":  # as a causal LM (model.task auto makes a BERT config a sequence classifier)
        path = recipe(tmp_path, rows_file, model={"config": BERT, "task": "causal-lm"})
    else:
        from transformers import AutoConfig, AutoModelForCausalLM  # not through bigtrain, which refuses it

        fields = {k: v for k, v in BERT.items() if k != "model_type"}
        AutoModelForCausalLM.from_config(AutoConfig.for_model("bert", **fields)).save_pretrained(tmp_path / "bert")
        folder = tmp_path / "bert"
        path = write_recipe(tmp_path / "r.yaml", recipe_dict(tmp_path, rows_file, folder))
    proc = cli_in_process(["train", str(path)])
    one_line(proc, "model_type 'bert' is an encoder whose attention sees the whole")
    # the advice is a classifier or a decoder-only model, never is_decoder=true (which FSDP2 then cannot shard: BERT's
    # tied decoder weights are another group's)
    assert "is_decoder" not in proc.stderr and "sequence-classification" in proc.stderr
    # a decoder-only model passes the same check, and so does BERT configured as a decoder
    from bigtrain.config.hf import hf_config_from_dict

    hf_config_from_dict(dict(TINY_MODELS["gpt2"]))
    hf_config_from_dict({**BERT, "is_decoder": True})


def test_a_diverging_run_stops_with_one_line_and_standard_json(tmp_path, rows_file):
    path = recipe(tmp_path, rows_file, train={"steps": 4, "lr": 1e30, "grad_clip": 0.0}, parallel={"backend": "ddp"})
    proc = run_cli(["train", str(path)], timeout=180)
    one_line(proc, "training stopped", code=4)
    assert "Lower train.lr (now 1e+30)" in proc.stderr
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # strict JSON: no NaN or Infinity tokens
    assert "NaN" not in "".join(lines) and "Infinity" not in "".join(lines)
    last = records[-1]
    assert last["loss"] is None or last["grad_norm"] is None or not math.isfinite(last["loss"])
    assert len(records) < 4  # it stopped at the first non-finite step


# (what is wrong, recipe sections to change, the file to write, what the error must say)
BAD = {
    "seq_len beyond GPT-2's positions": (
        {"model": {"config": {**TINY_MODELS["gpt2"], "n_positions": 8}}},
        None,
        "data.seq_len=17 exceeds the model's 8 learned positions (gpt2); use data.seq_len <= 8",
    ),
    "adam_beta1 >= 1": ({"train": {"adam_beta1": 1.0}}, None, "train.adam_beta1=1.0 must be in [0, 1)"),
    "lr nan": ({"train": {"lr": float("nan")}}, None, "train.lr=nan must be a finite number"),
    "lr 0": ({"train": {"lr": 0.0}}, None, "train.lr=0 would leave the model as it is"),
    "bad attn_implementation": (
        {"model": {"attn_implementation": "magic"}},
        None,
        "model.attn_implementation='magic' cannot build llama",
    ),
    "fewer rows than a global batch": (
        {"train": {"global_batch_size": 128}},
        None,
        "gives 64 sequence(s), fewer than one global batch of train.global_batch_size=128",
    ),
    "empty npy": ({}, ("rows.npy", np.zeros((0, SEQ), dtype=np.int64)), "has shape (0, 17): it needs at least one row"),
    "npy of width 1": ({}, ("rows.npy", np.zeros((8, 1), dtype=np.int64)), "has shape (8, 1): it needs"),
    "random bytes as npy": ({}, ("rows.npy", b"\x00\x01garbage" * 10), "is not a NumPy .npy file (no .npy header)"),
    "non-UTF-8 text": (
        {"data": {"seq_len": 8}},
        ("docs.jsonl", b'{"text": "caf\xe9"}\n'),
        "is not UTF-8 text (byte 13, line 1)",
    ),
    "a directory as data.path": ({"data": {"path": "DIR"}}, None, "is a folder with neither a saved dataset"),
    "eval_every without held-out data": (
        {"train": {"eval_every": 5}},
        None,
        "train.eval_every=5 needs held-out data: set data.eval_path or data.eval_fraction",
    ),
    "eval_fraction that leaves nothing": ({"data": {"eval_fraction": 1.0}}, None, "must be below 1 (e.g. 0.05)"),
    "eval rows of another length": (
        {"data": {"eval_path": "EVAL"}},
        None,
        "has rows of 9 tokens but data.path of 17; evaluate on rows of the training length",
    ),
    "chat data without a chat template": (
        {"data": {"seq_len": 64}},
        ("chat.jsonl", b'{"messages": [{"role": "user", "content": "hi"}]}\n'),
        "built-in byte tokenizer has none; set data.tokenizer to a local HF tokenizer folder with a chat template",
    ),
    "a format that does not apply to token ids": (
        {"data": {"format": "chat"}},
        None,
        "is tokenised already; data.format=chat applies to records only",
    ),
    "packed documents on a model that lets them see each other": (
        {
            "model": {
                "config": {
                    "model_type": "opt",
                    "vocab_size": 300,
                    "hidden_size": 32,
                    "ffn_dim": 64,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 2,
                }
            },
            "data": {"seq_len": 16},
        },
        ("inst.jsonl", b'{"prompt": "a", "completion": "b"}\n' * 60),
        "opt with attn_implementation=sdpa lets a packed record attend to the one before it",
    ),
    "unknown pp_schedule": (
        {"parallel": {"pp_schedule": "zigzag"}},
        None,
        "parallel.pp_schedule='zigzag' is not allowed; use one of",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line(case, tmp_path, rows_file, cli_in_process):
    sections, file, expected = BAD[case]
    data_path = rows_file
    if file is not None:
        name, content = file
        data_path = tmp_path / name
        if isinstance(content, bytes):
            data_path.write_bytes(content)
        else:
            save_rows(data_path, content)
    if sections.get("data", {}).get("path") == "DIR":
        sections = {"data": {"path": str(tmp_path)}}
    if sections.get("data", {}).get("eval_path") == "EVAL":
        save_rows(tmp_path / "eval.npy", np.zeros((4, 9), dtype=np.int64))
        sections = {"data": {"eval_path": str(tmp_path / "eval.npy")}}
    one_line(cli_in_process(["train", str(recipe(tmp_path, data_path, **sections))]), expected)


def test_output_dir_that_cannot_be_written_is_found_before_training(tmp_path, rows_file, cli_in_process):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    path = recipe(tmp_path, rows_file, output_dir=str(blocker / "out"))
    one_line(cli_in_process(["train", str(path)]), "is a file, not a folder")


@pytest.mark.full
def test_damaged_weights_and_mismatched_shapes_name_the_file(tmp_path, rows_file, cli_in_process):
    folder = save_tiny_model(tmp_path / "model")
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])  # truncated by a copy that did not finish
    spec = recipe_dict(tmp_path / "out", rows_file, folder, train={"steps": 1, "global_batch_size": 8})
    path = write_recipe(tmp_path / "r.yaml", spec)
    proc = run_cli(["train", str(path)], timeout=180)
    one_line(proc, "model.safetensors is damaged or truncated")
    # weights of another width under this config: the parameter and the file are named
    save_tiny_model(tmp_path / "other", hidden_size=32, intermediate_size=64)
    weights.write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    proc = run_cli(["train", str(path)], timeout=180)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "model.safetensors has shape" in proc.stderr and "do not belong together" in proc.stderr


def test_yaml_mistakes_name_line_and_column(tmp_path, cli_in_process):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  steps: 2\n  lr: [1e-4\n")
    one_line(cli_in_process(["train", str(path)]), "at line 4, column 1")
    path.write_text("train:\n  steps: 2\n")
    one_line(cli_in_process(["train", str(path), "--set", "train.lr=[1"]), "--set 'train.lr=[1': the value is not")


def test_a_tokenizer_folder_without_a_tokenizer_says_so(tmp_path, cli_in_process):
    folder = save_tiny_model(tmp_path / "model")  # weights and config only
    text = tmp_path / "docs.txt"
    text.write_text("hello world " * 50)
    path = recipe(tmp_path, text, data={"seq_len": 8, "tokenizer": str(folder)})
    one_line(cli_in_process(["train", str(path)]), "holds no tokenizer (none of tokenizer.json")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--gpus", "8", "--gpu-memory", "80"], "--gpu-memory '80' has no unit; write e.g. 80GB"),
        (["--gpus", "0", "--gpu", "H100"], "--gpus 0 must be at least 1"),
        (["--gpus", "8", "--gpu", "H100", "--seq-len", "0"], "--seq-len 0 must be at least 2"),
        (["--gpus", "8", "--gpu", "H100", "--global-batch-size", "0"], "--global-batch-size 0 must be at least 1"),
        (["--gpus", "12", "--gpus-per-node", "8", "--gpu", "H100"], "--gpus 12 is not a whole number of nodes"),
    ],
)
def test_plan_input_is_checked(args, expected, cli_in_process):
    one_line(cli_in_process(["plan", "--model", "llama-3-8b", *args]), expected)


def test_plan_and_train_share_one_rule_for_positions(cli_in_process, caplog):
    """Beyond a learned position table (GPT-2: 1024) refused; beyond a rotary model's max_position_embeddings
    (Llama-3: 8192) a warning, as bigtrain train does."""
    proc = cli_in_process(["plan", "--model", "gpt2", "--gpus", "8", "--gpu", "H100", "--seq-len", "2048"])
    one_line(proc, "--seq-len=2048 exceeds the model's 1024 learned positions (gpt2); use --seq-len <= 1024")
    proc = cli_in_process(["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "H100", "--seq-len", "16384"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--seq-len=16384 is beyond the model's max_position_embeddings=8192" in caplog.text


def test_version(cli_in_process):
    from bigtrain import __version__

    proc = cli_in_process(["--version"])
    assert proc.returncode == 0 and proc.stdout.startswith(f"bigtrain {__version__} (torch ")
    from importlib.metadata import version

    assert f"transformers {version('transformers')}," in proc.stdout and len(proc.stdout.splitlines()) == 1


def test_dry_run_checks_everything_and_trains_nothing(tmp_path, rows_file, cli_in_process):
    path = recipe(tmp_path, rows_file)
    proc = cli_in_process(["train", str(path), "--dry-run", "--nproc", "2"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "global batch 8 = micro 1 x dp 2 x accum 4" in proc.stdout and "2 rank(s)" in proc.stdout
    assert "model:" in proc.stdout and "parallel:" in proc.stdout  # the resolved recipe, as YAML
    assert proc.stdout.strip().endswith("nothing trained (--dry-run)")
    assert not (tmp_path / "out").exists()
    # plan: auto is planned for this machine; bad input is the same one line as a real start
    auto = cli_in_process(["train", str(path), "--dry-run", "--set", "parallel.plan=auto"])
    assert auto.returncode == 0 and "1 rank(s)" in auto.stdout, auto.stderr[-2000:]
    one_line(cli_in_process(["train", str(path), "--dry-run", "--set", "train.lr=0"]), "train.lr=0 would leave")
    one_line(cli_in_process(["train", str(path), "--dry-run", "--nproc", "0"]), "--nproc=0 must be at least 1")


def test_a_restart_without_a_checkpoint_keeps_the_earlier_metrics(tmp_path, rows_file):
    """The same recipe again, after a start that saved no checkpoint: training restarts at step 0 (nothing to resume)
    and the earlier start's metrics move aside instead of being overwritten."""
    from bigtrain.checkpoint.run_dir import plan_start, prepare_output_dir
    from bigtrain.config.load import dump_recipe, load_recipe

    cfg = load_recipe(recipe(tmp_path, rows_file))
    out = tmp_path / "out"
    out.mkdir()
    (out / "recipe.yaml").write_text(dump_recipe(cfg))
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    for _ in range(2):  # twice within a second: two folders
        start = plan_start(cfg)
        assert start.resume_from is None and "starting again at step 0; its outputs move to" in start.note
        prepare_output_dir(start, cfg)
        (out / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    aside = sorted(out.glob("replaced-*"))
    assert len(aside) == 2 and all((a / "metrics.jsonl").read_text().startswith('{"step": 1') for a in aside)
