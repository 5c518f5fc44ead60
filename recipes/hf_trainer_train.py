"""Train a recipe's model on its data with the HuggingFace Trainer, configured by ``bigtrain.plan``.

    torchrun --nproc-per-node 8 recipes/hf_trainer_train.py recipes/finetune_local.yaml

``bigtrain.plan(recipe=...)`` chooses the plan for the GPUs of the job (FSDP2, DeepSpeed ZeRO or DDP, micro-batch,
accumulation, checkpointing) and ``to_training_arguments`` hands it to the Trainer with the recipe's optimizer,
schedule, clipping and precision. The model and the token rows come from the recipe. On a machine without GPUs the
Trainer runs DDP over CPU processes (its FSDP and DeepSpeed need GPUs), so the plan is pinned to ddp there.
``MemoryCheckCallback`` logs the measured peak beside the planner's prediction after two steps.

The Trainer is aligned with ``bigtrain train`` where its defaults would train another model (bigtrain/api/same_run.py:
data order, warmup, weight decay), so both train the same model on the same rows. Extra ``--set key=value``
arguments override recipe keys as in ``bigtrain train``.
"""

from __future__ import annotations

import argparse
import logging

import torch
from transformers import AutoModelForCausalLM, Trainer

import bigtrain
from bigtrain.api.same_run import (
    aligned_trainer,
    end_training,
    hf_examples,
    plan_this_job,
    save_final_weights,
    step_order,
    summary_line,
    training_rows,
)
from bigtrain.config.load import load_recipe
from bigtrain.models.build import load_hf_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    cli = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = load_recipe(cli.recipe, cli.overrides)
    result = plan_this_job(cfg)  # bigtrain.plan(recipe=cfg) for this job (ddp on CPUs), its table printed once
    on_cpu = not torch.cuda.is_available()
    # The arguments first: with DeepSpeed ZeRO-3 they make the model below be built partitioned (zero.Init).
    args = result.to_training_arguments(
        output_dir=cfg.output_dir,
        use_cpu=on_cpu,
        train_sampling_strategy="sequential",
        save_strategy="no",
        log_level="info",  # the Trainer's own lines, and with them MemoryCheckCallback's
    )
    torch.manual_seed(cfg.train.seed)
    if cfg.model.name_or_path:
        model = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path)
    else:
        model = AutoModelForCausalLM.from_config(load_hf_config(cfg.model))
    data = training_rows(cfg)
    dataset = hf_examples(data, step_order(data.num_rows, cfg))
    check = bigtrain.MemoryCheckCallback(result, after_steps=min(2, cfg.train.steps))
    trainer = aligned_trainer(Trainer, cfg.train)(model=model, args=args, train_dataset=dataset, callbacks=[check])
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
