"""Step time of one record per row (``data.packing: pad``): bigtrain's micro-batches cut to their longest row beside
the plain HF Trainer (``DataCollatorForSeq2Seq``, padding to the longest row) and TRL's ``SFTTrainer`` (its collator
pads to the longest row too), on the same unpacked chat job.

    python bench/padding_speed.py              # 3 rounds (~6 minutes on 2 CPU cores)
    python bench/padding_speed.py --rounds 1

The job: the chat demo (``recipes/make_chat_demo.py``: a tiny Llama, 2,000 conversations), rows of up to 512
tokens, DDP on 2 CPU processes (gloo), global batch 8 = micro 2 x 2 ranks x accumulation 2, 30 steps, no
evaluation or checkpoint. A step's time is the wall time between two optimizer steps (bigtrain: ``elapsed_s`` in
metrics.jsonl; TRL: a callback at each step's end); each run's figure is the median of its steps 3-30, the table's
the median over rounds, the contenders alternating within each round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS, SEQ = 30, 512


def peer_arguments(out: str) -> dict:
    """The HF Trainer's arguments both peers run with: the job's batch shape on CPU, DDP over gloo, nothing saved,
    no bar; the last incomplete batch dropped as bigtrain's global order never makes one."""
    return dict(output_dir=out, max_steps=STEPS, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                report_to="none", save_strategy="no", logging_steps=STEPS, use_cpu=True, ddp_backend="gloo",
                disable_tqdm=True, dataloader_drop_last=True)  # fmt: skip


def trl_worker(data: str, model: str, out: str) -> None:
    """One rank of TRL's SFTTrainer (under torchrun); rank 0 prints its step times as JSON."""
    import torch.distributed as dist
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    ends: list[float] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            ends.append(time.perf_counter())

    args = SFTConfig(**peer_arguments(out), max_length=SEQ)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model),
        args=args,
        train_dataset=load_dataset("json", data_files=data, split="train"),
        processing_class=AutoTokenizer.from_pretrained(model),
        callbacks=[StepEnds()],
    )
    trainer.train()
    if dist.get_rank() == 0:
        print("STEP_ENDS", json.dumps(ends), flush=True)


def hf_worker(data: str, model: str, out: str) -> None:
    """One rank of the plain HF Trainer: the conversations through the chat template (cut at 512 tokens), labels on
    every token (which tokens are labelled does not change the compute), batches padded to their longest row by
    ``DataCollatorForSeq2Seq``; rank 0 prints its step times as JSON."""
    import torch.distributed as dist
    from datasets import load_dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(model)
    ends: list[float] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            ends.append(time.perf_counter())

    def tokenised(record: dict) -> dict:
        ids = tokenizer.apply_chat_template(record["messages"], tokenize=True, return_dict=False)[:SEQ]
        return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": list(ids)}

    train = load_dataset("json", data_files=data, split="train").map(tokenised, remove_columns=["messages"])
    args = TrainingArguments(**peer_arguments(out))
    collator = DataCollatorForSeq2Seq(tokenizer, padding="longest")
    model_ = AutoModelForCausalLM.from_pretrained(model)
    trainer = Trainer(model=model_, args=args, train_dataset=train, data_collator=collator, callbacks=[StepEnds()])
    trainer.train()
    if dist.get_rank() == 0:
        print("STEP_ENDS", json.dumps(ends), flush=True)


def median_step(ends: list[float]) -> float:
    """The median time between optimizer steps 3-30 (the first two warm up)."""
    return statistics.median(b - a for a, b in zip(ends[2:], ends[3:], strict=False))


def run_bigtrain(folder: Path, round_: int) -> float:
    out = folder / f"bigtrain_{round_}"
    sets = {"model.name_or_path": folder / "demo" / "base", "data.path": folder / "demo" / "train.jsonl",
            "data.eval_path": "null", "data.packing": "pad", "data.cache_dir": folder / "cache",
            "parallel.backend": "ddp", "train.steps": STEPS, "train.eval_every": 0, "train.log_to": "jsonl",
            "checkpoint.every": 0, "checkpoint.save_final_model": "false", "output_dir": out}  # fmt: skip
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    command = [sys.executable, "-m", "bigtrain", "train", str(REPO / "recipes" / "chat_finetune.yaml"), *args]
    subprocess.run([*command, "--nproc", "2"], cwd=folder, check=True, capture_output=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return median_step([r["elapsed_s"] for r in rows if "elapsed_s" in r])


def run_peer(folder: Path, round_: int, which: str) -> float:
    """``which`` (trl or hf) under torchrun, 2 processes: the median of its step times."""
    worker = [str(folder / "demo" / "train.jsonl"), str(folder / "demo" / "base"), str(folder / f"{which}_{round_}")]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    command = [*launcher, __file__, f"--{which}-worker", *worker]
    # one thread per rank, as bigtrain --nproc 2 sets on 2 cores (cli/launch.py)
    env = {**os.environ, "HF_DATASETS_CACHE": str(folder / "hf_cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, cwd=folder, check=True, capture_output=True, text=True, env=env)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("STEP_ENDS"))
    return median_step(json.loads(line.removeprefix("STEP_ENDS ")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trl-worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--hf-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker or args.hf_worker:
        (trl_worker if args.trl_worker else hf_worker)(*(args.trl_worker or args.hf_worker))
        return
    times: dict[str, list[float]] = {"bigtrain": [], "HF Trainer": [], "TRL SFTTrainer": []}
    with tempfile.TemporaryDirectory(prefix="padding_speed_") as tmp:
        folder = Path(tmp)
        subprocess.run([sys.executable, str(REPO / "recipes" / "make_chat_demo.py"), "demo"], cwd=folder, check=True,
                       capture_output=True)  # fmt: skip
        for round_ in range(args.rounds):
            times["bigtrain"].append(run_bigtrain(folder, round_))
            times["HF Trainer"].append(run_peer(folder, round_, "hf"))
            times["TRL SFTTrainer"].append(run_peer(folder, round_, "trl"))
            print(json.dumps({"round": round_, **{k: v[-1] for k, v in times.items()}}), flush=True)
    ours = statistics.median(times["bigtrain"])
    print("| contender | s/step (median of rounds) | rounds | vs bigtrain |")
    print("|---|---|---|---|")
    for name, values in times.items():
        mid = statistics.median(values)
        print(f"| {name} | {mid:.4f} | {', '.join(f'{v:.4f}' for v in values)} | {mid / ours:.2f}x |")


if __name__ == "__main__":
    main()
