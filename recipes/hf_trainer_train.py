"""Train a recipe's model on its data with the HuggingFace Trainer, configured by arguments bigtrain exported.

    bigtrain export recipes/deepspeed_zero3.yaml --to hf-trainer --gpus 2 -o trainer_args.json
    torchrun --nproc-per-node 2 recipes/hf_trainer_train.py recipes/deepspeed_zero3.yaml trainer_args.json

The plan (DeepSpeed ZeRO, FSDP2 or DDP), batch, accumulation, optimizer, schedule, clipping and precision come from
the JSON; the model and the token rows from the recipe, read with bigtrain's loaders. Extra ``--set key=value``
arguments override recipe keys as in ``bigtrain train``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

from bigtrain.config.load import load_recipe
from bigtrain.data import TokenRows, load_token_rows
from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.data.sources import hold_out
from bigtrain.models.build import load_hf_config


def training_arguments(path: str) -> TrainingArguments:
    kwargs = json.loads(Path(path).read_text())
    if "parallelism_config" in kwargs:  # JSON holds ParallelismConfig's arguments; TrainingArguments wants the object
        from accelerate.parallelism_config import ParallelismConfig

        kwargs["parallelism_config"] = ParallelismConfig(**kwargs["parallelism_config"])
    return TrainingArguments(**kwargs)


def trainer_examples(data: TokenRows) -> list[dict[str, torch.Tensor]]:
    """bigtrain's rows as the Trainer's examples, with the same labels: HF's loss shifts labels by one itself, so
    bigtrain's already-shifted labels (IGNORE_INDEX on prompts, padding, ...) move one position right; packed
    documents keep their restarting position ids."""
    out = []
    for i in range(data.num_rows):
        batch = data.micro_batch(np.array([i]))
        labels = torch.cat([torch.tensor([IGNORE_INDEX]), batch.labels[0, :-1]])
        example = {"input_ids": batch.input_ids[0], "labels": labels}
        if batch.position_ids is not None:
            example["position_ids"] = batch.position_ids[0]
        out.append(example)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("trainer_args", help="JSON written by bigtrain export --to hf-trainer")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    cli = parser.parse_args()
    cfg = load_recipe(cli.recipe, cli.overrides)
    # The arguments first: with DeepSpeed ZeRO-3 they make the model below be built partitioned (zero.Init).
    args = training_arguments(cli.trainer_args)
    torch.manual_seed(cfg.train.seed)
    if cfg.model.name_or_path:
        model = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path)
    else:
        model = AutoModelForCausalLM.from_config(load_hf_config(cfg.model))
    data = load_token_rows(cfg.data)
    if cfg.data.eval_fraction > 0:  # train on the rows bigtrain trains on, not its held-out ones
        data, _ = hold_out(data, cfg.data.eval_fraction, cfg.train.seed)
    dataset = trainer_examples(data)
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    trainer.train()
    if trainer.is_world_process_zero():
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        kind = str(trainer.accelerator.distributed_type)
        print(json.dumps({"distributed_type": kind, "world_size": args.world_size, "losses": losses}))


if __name__ == "__main__":
    main()
