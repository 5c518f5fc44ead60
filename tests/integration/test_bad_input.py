"""Bad input fails fast, on every rank, with one line naming the key; a failure on one rank never hangs the others."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from cases import TINY_GEMMA2, TINY_MODELS
from helpers import REPO, recipe_dict, run_cli, run_torchrun, save_rows, write_recipe

from bigtrain.errors import ConfigError

SEQ = 17


@pytest.fixture
def rows_file(tmp_path):
    return save_rows(tmp_path / "rows.npy", num_rows=64, seq_len=SEQ)


def base_recipe(tmp_path, rows_file):
    return recipe_dict(
        tmp_path / "out",
        rows_file,
        data={"shuffle": False},
        train={"steps": 2, "global_batch_size": 8},
        parallel={"backend": "fsdp2"},
    )


# (what is wrong, how to break the recipe, what the error line must say)
CASES = {
    "unknown key": (lambda r: r["train"].update(stepz=3), "unknown recipe key train.stepz; did you mean train.steps?"),
    "wrong type": (lambda r: r["train"].update(steps="many"), "train.steps='many' must be an integer"),
    "missing data": (
        lambda r: r["data"].update(path="/nonexistent/rows.npy"),
        "data.path='/nonexistent/rows.npy' does not exist",
    ),
    "batch not divisible": (
        lambda r: r["train"].update(global_batch_size=7),
        "train.global_batch_size=7 is not a multiple of parallel.micro_batch_size=1 x data-parallel degree 2 = 2; try 6 or 8",
    ),
    "tp does not divide the KV heads": (
        lambda r: r["parallel"].update(tp=2) or r["model"]["config"].update(num_key_value_heads=1),
        "parallel.tp=2 does not divide num_key_value_heads=1; try 1",
    ),
    "tp for a model without a layout": (
        lambda r: r["parallel"].update(tp=2) or r["model"].update(config=dict(TINY_MODELS["gpt2"])),
        "model_type 'gpt2' ships no tensor-parallel layout",
    ),
    "offload with a backend that cannot offload": (
        lambda r: r["parallel"].update(offload_optimizer=True),
        "parallel.offload_optimizer=true needs backend deepspeed (ZeRO-Offload); backend fsdp2 offloads parameters",
    ),
    "LoRA targets that name no linear": (
        lambda r: r["train"].update(method="lora") or r.update(lora={"target_modules": ["q_proj", "qproj"]}),
        "lora.target_modules: 'qproj' names no linear module of this model; its linear modules are down_proj, "
        "gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj (in every decoder block) and lm_head (outside)",
    ),
    "a module both trained fully and adapted": (
        lambda r: r["train"].update(method="lora") or r.update(lora={"modules_to_save": ["embed_tokens", "mlp"]}),
        "lora.modules_to_save: 'mlp' selects model.layers.0.mlp, which holds an adapted linear "
        "(model.layers.0.mlp.gate_proj); a module trains either fully or through adapters: name another, or leave it "
        "out of lora.target_modules",
    ),
    "cp that does not divide the sequence": (
        lambda r: r["parallel"].update(cp=2),
        f"parallel.cp=2 does not divide the rows' sequence length {SEQ}; use a sequence length that is a multiple "
        f"of 2 (data.seq_len) or a cp that divides {SEQ}",
    ),
    "QLoRA computing in fp32": (
        lambda r: r["train"].update(method="qlora"),
        "train.method=qlora dequantises its 4-bit base to bf16 for every matmul; train.mixed_precision=fp32 cannot "
        "be its compute dtype: set train.mixed_precision=bf16, or use method lora",
    ),
    "QLoRA on a backend that cannot run it": (
        lambda r: (
            r["train"].update(method="qlora", mixed_precision="bf16") or r["parallel"].update(backend="deepspeed")
        ),
        "train.method=qlora with backend deepspeed is not built yet",
    ),
    "an attention implementation the family has not": (
        lambda r: r["model"].update(config=dict(TINY_GEMMA2)) or r["model"].update(attn_implementation="sdpa"),
        "model.attn_implementation='sdpa' cannot build gemma2 (Gemma2ForCausalLM does not support an attention "
        "implementation through torch.nn.functional.scaled_dot_product_attention yet); for gemma2 use eager or "
        "flex_attention (or auto, the family's own default)",
    ),
    "LoRA on a model without a folder, its adapter exported at the end": (
        lambda r: r["train"].update(method="lora"),
        "train.method=lora on a model built from model.config: the final adapter folder names its base by folder, and "
        "this one has none (its values are drawn from train.seed); save the model first (model.save_pretrained(FOLDER)) "
        "and set model.name_or_path, or set checkpoint.save_final_model=false",
    ),
    "a token file streamed": (
        lambda r: r["data"].update(streaming=True, seq_len=SEQ),
        "cannot be streamed (data.streaming); give .parquet, .arrow, .json or .jsonl files",
    ),
    "a classifier's data streamed": (
        lambda r: r["data"].update(streaming=True, path="builtin:shapes", image_size=32)
        or r["model"].update(config=dict(model_type="resnet", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                         layer_type="basic")),  # fmt: skip
        "data.streaming reads a causal LM's text, chat or instruction records; this job (model.task "
        "image-classification",
    ),
    "degrees mismatch": (
        lambda r: r["parallel"].update(dp_replicate=2, dp_shard=2),
        "dp_replicate=2 x dp_shard=2 x tp=1 x pp=1 = 4 do not match the world size 2",
    ),
}


def lone_ranks(args: list[str], world_size: int = 2) -> list[subprocess.Popen]:
    """Each rank as an independent process, as a launcher would start them, but with no peer ever joining.

    A rank that validated only after meeting its peers would wait at rendezvous; each must instead fail by itself.
    """
    procs = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1",
        }  # nothing listens there: joining would fail or hang
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "bigtrain", *args],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("rank", [0, 1])
def test_every_rank_refuses_with_one_clear_line_before_any_process_group(case, rank, tmp_path, rows_file):
    """What each rank of a 2-rank job does before it would meet its peers (reading the recipe, then start-up's
    checks), run in this process: the line names the key. The processes themselves: the test below."""
    from bigtrain.config.load import load_recipe
    from bigtrain.runtime import LaunchEnv
    from bigtrain.train.run import TrainingJob

    breaker, expected = CASES[case]
    recipe = base_recipe(tmp_path, rows_file)
    breaker(recipe)
    path = write_recipe(tmp_path / "bad.yaml", recipe)
    env = LaunchEnv(rank=rank, world_size=2, local_rank=rank, local_world_size=2, launched=True)
    with pytest.raises(ConfigError) as e:
        TrainingJob(load_recipe(path), env)
    assert expected in str(e.value)


def test_lone_ranks_each_exit_with_the_line_before_rendezvous(tmp_path, rows_file):
    """Two ranks started as a launcher would, with no peer ever reachable: each fails by itself, exit 2, with the
    rank-tagged line (a rank that validated only after meeting its peers would wait at rendezvous)."""
    breaker, expected = CASES["batch not divisible"]
    recipe = base_recipe(tmp_path, rows_file)
    breaker(recipe)
    path = write_recipe(tmp_path / "bad.yaml", recipe)
    start = time.monotonic()
    procs = lone_ranks(["train", str(path)])
    for rank, proc in enumerate(procs):
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err[-2000:]
        assert err.strip().splitlines()[-1].startswith(f"bigtrain: error (rank {rank}/2): ")
        assert expected in err
    elapsed = time.monotonic() - start
    assert elapsed < 60, f"took {elapsed:.0f}s"


def test_torchrun_job_fails_fast_with_the_line(tmp_path, rows_file):
    recipe = base_recipe(tmp_path, rows_file)
    recipe["train"]["global_batch_size"] = 7
    start = time.monotonic()
    proc = run_torchrun(["train", str(write_recipe(tmp_path / "bad.yaml", recipe))], timeout=120)
    assert proc.returncode != 0
    # Whichever rank fails first, torchrun's agent stops the other: every error line printed is the right one.
    lines = [line for line in proc.stderr.splitlines() if line.startswith("bigtrain: error (rank ")]
    assert lines and all("train.global_batch_size=7 is not a multiple" in line for line in lines)
    assert time.monotonic() - start < 60


def test_nproc_rejects_bad_plan_before_starting_workers(tmp_path, rows_file):
    recipe = base_recipe(tmp_path, rows_file)
    recipe["train"]["global_batch_size"] = 7
    proc = run_cli(["train", str(write_recipe(tmp_path / "bad.yaml", recipe)), "--nproc", "2"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("bigtrain: error: train.global_batch_size=7")


def test_bad_override_single_process(tmp_path, rows_file):
    path = write_recipe(tmp_path / "ok.yaml", base_recipe(tmp_path, rows_file))
    proc = run_cli(["train", str(path), "--set", "parallel.backend=megatron"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "bigtrain: error: parallel.backend='megatron' is not allowed; use one of: ddp, fsdp2, deepspeed"
    )


def test_failure_on_one_rank_does_not_hang_the_other(tmp_path, rows_file):
    # Rank 1 raises inside step 2 while rank 0 waits in that step's collectives: the launcher must end the whole
    # job promptly (the collective timeout is set far beyond the test's limit, so it is not what ends it).
    recipe = base_recipe(tmp_path, rows_file)
    recipe["train"]["steps"] = 4
    recipe["train"]["collective_timeout_s"] = 300
    path = write_recipe(tmp_path / "r.yaml", recipe)
    start = time.monotonic()
    proc = run_torchrun(
        [str(REPO / "tests" / "integration" / "fail_on_rank.py"), "1", "2", "train", str(path)],
        module=False,
        timeout=200,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "injected failure on rank 1 in step 2" in proc.stderr
    assert elapsed < 90, f"took {elapsed:.0f}s"


def test_token_ids_outside_the_vocabulary_fail_at_load_on_every_rank(tmp_path):
    # found when the data is loaded, on every rank, before any process group: not when its batch comes up
    rows = np.random.default_rng(0).integers(0, 128, size=(64, SEQ))
    rows[50, 3] = 500
    save_rows(tmp_path / "rows.npy", rows)
    path = write_recipe(tmp_path / "r.yaml", base_recipe(tmp_path, tmp_path / "rows.npy"))
    for rank, proc in enumerate(lone_ranks(["train", str(path)])):
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err[-2000:]
        assert err.strip().splitlines()[-1].startswith(f"bigtrain: error (rank {rank}/2): data.path=")
        assert "token id 500 (row 50, position 3) outside the model's vocabulary of 128" in err
