"""A streamed HF dataset (``data.streaming``) trains on the rows the data cache would give, and a resume, on another
world size too, opens the stream where the checkpoint stopped and trains the same steps.

Real jobs (torchrun, gloo, fp32) of ``bigtrain train`` on a glob of ``.jsonl`` shards: a straight streamed run of 6
steps on FSDP2 x 2 with accumulation checkpoints after step 3; the same recipe without streaming (the cache's rows,
in file order) must log the same losses; a one-rank run resumed from step 3 must log steps 4-6 as the straight run.
"""

from __future__ import annotations

import json

import pytest
from cases import TINY_LLAMA
from helpers import read_metrics, recipe_dict, run_torchrun, write_recipe

pytestmark = pytest.mark.full

STEPS, BATCH = 6, 8
SAME_RTOL = 1e-6  # the same rows on the same plan
RESHARD_RTOL = 1e-4  # another world size sums in another order


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    root = tmp_path_factory.mktemp("streaming")
    (root / "shards").mkdir()
    for shard in range(3):
        with open(root / "shards" / f"part{shard}.jsonl", "w") as f:
            for i in range(60):
                f.write(json.dumps({"text": f"story {shard}.{i}: " + "the cat sat on the mat. " * (i % 4 + 1)}) + "\n")
    recipe = recipe_dict(
        root / "out",
        root / "shards" / "*.jsonl",
        {**TINY_LLAMA, "vocab_size": 257},
        data={"streaming": True, "seq_len": 32, "cache_dir": str(root / "cache")},
        train={"steps": STEPS, "global_batch_size": BATCH, "lr": 1e-2, "seed": 5},
        parallel={"backend": "fsdp2", "micro_batch_size": 2},
        checkpoint={"every": 3, "keep": 5},
    )
    path = write_recipe(root / "recipe.yaml", recipe)
    proc = run_torchrun(["train", str(path)], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "streamed: text, stream-packed rows of 32" in proc.stderr
    return path, root / "out"


def test_a_stream_trains_on_the_rows_the_cache_gives(straight, tmp_path):
    path, out = straight
    args = ["--set", "data.streaming=false", "--set", "data.shuffle=false", "--set", f"output_dir={tmp_path / 'out'}"]
    proc = run_torchrun(["train", str(path), *args], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    indexed, streamed = read_metrics(tmp_path / "out"), read_metrics(out)
    assert len(indexed) == len(streamed) == STEPS
    for mine, theirs in zip(streamed, indexed, strict=True):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=SAME_RTOL), mine["step"]


def test_a_streamed_run_resumes_where_it_stopped_on_another_world_size(straight, tmp_path):
    path, out = straight
    checkpoint = out / "checkpoints" / "step_3"
    args = ["--set", f"checkpoint.resume={checkpoint}", "--set", f"output_dir={tmp_path / 'resumed'}"]
    proc = run_torchrun(["train", str(path), *args], nproc=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"data.path: the stream goes on at row {3 * BATCH} (epoch 0, record" in proc.stderr
    got, ref = read_metrics(tmp_path / "resumed"), read_metrics(out)
    assert [r["step"] for r in got] == [4, 5, 6]
    for mine, theirs in zip(got, ref[3:], strict=True):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=RESHARD_RTOL), mine["step"]
