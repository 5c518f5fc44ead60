"""Fine-tune a recipe's model on its chat data with TRL's ``SFTTrainer``, configured by ``bigtrain.plan``.

    pip install 'bigtrain[trl]'
    torchrun --nproc-per-node 8 recipes/trl_sft_train.py recipes/chat_finetune.yaml --set data.packing=pad

The data is the recipe's ``{"messages": [...]}`` .jsonl, tokenised by TRL with the tokenizer's chat template, the
loss on the assistant's tokens only (``assistant_only_loss``: the template marks them with ``{% generation %}``).
``bigtrain.plan(recipe=...)`` chooses the plan for the GPUs of the job and ``to_sft_config`` hands it to TRL with the
recipe's optimizer, schedule, clipping and precision, and ``max_length`` its ``data.seq_len``. On a machine without
GPUs the Trainer runs DDP over CPU processes, so the plan is pinned to ddp there. ``MemoryCheckCallback`` logs the
measured peak beside the prediction.

One conversation per row, as bigtrain reads chat data with ``data.packing: pad`` and no held-out fraction; the
conversations arrive in bigtrain's order, and TRL's Trainer is aligned with bigtrain's warmup and weight decay
(bigtrain/api/same_run.py), so both train the same model.
"""

from __future__ import annotations

import argparse
import logging

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTTrainer

import bigtrain
from bigtrain.api.same_run import (
    aligned_trainer,
    end_training,
    plan_this_job,
    save_final_weights,
    step_order,
    summary_line,
)
from bigtrain.config.load import load_recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    cli = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = load_recipe(cli.recipe, cli.overrides)
    if cfg.data.packing != "pad" or (cfg.data.eval_path is None and cfg.data.eval_fraction > 0):
        raise SystemExit(
            "trl_sft_train.py reads one conversation per row: set data.packing=pad and data.eval_fraction=0 "
            f"(the recipe has packing={cfg.data.packing}, eval_fraction={cfg.data.eval_fraction})"
        )
    result = plan_this_job(cfg)  # bigtrain.plan(recipe=cfg) for this job (ddp on CPUs), its table printed once
    on_cpu = not torch.cuda.is_available()
    args = result.to_sft_config(
        output_dir=cfg.output_dir,
        use_cpu=on_cpu,
        train_sampling_strategy="sequential",
        log_level="info",  # the Trainer's own lines, and with them MemoryCheckCallback's
        save_strategy="no",
        assistant_only_loss=True,
        packing=False,
        dataset_num_proc=None,
    )
    tokenizer = AutoTokenizer.from_pretrained(cfg.data.tokenizer or cfg.model.name_or_path)
    torch.manual_seed(cfg.train.seed)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path)
    conversations = load_dataset("json", data_files=cfg.data.path, split="train")
    dataset = conversations.select(step_order(len(conversations), cfg))  # bigtrain's order, read sequentially
    check = bigtrain.MemoryCheckCallback(result, after_steps=min(2, cfg.train.steps))
    trainer = aligned_trainer(SFTTrainer, cfg.train)(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[check]
    )
    trainer.train()
    if trainer.is_world_process_zero():
        logged = [entry for entry in trainer.state.log_history if "loss" in entry]
        losses, norms = [e["loss"] for e in logged], [e["grad_norm"] for e in logged]
        weights = save_final_weights(trainer.accelerator.unwrap_model(trainer.model), cfg.output_dir)
        kind = trainer.accelerator.distributed_type
        print(summary_line(result, kind, args.world_size, losses, check.check, norms, weights))
    end_training(trainer.accelerator)  # every rank's collectives done, then the group torn down


if __name__ == "__main__":
    main()
