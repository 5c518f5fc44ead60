"""Train a recipe's model on its data with a plain accelerate loop, configured by ``bigtrain.plan``.

    accelerate launch --num_processes 8 recipes/accelerate_train.py recipes/finetune_local.yaml
    torchrun --nproc-per-node 8 recipes/accelerate_train.py recipes/finetune_local.yaml

``bigtrain.plan(recipe=...)`` chooses the plan for the GPUs of the job; ``Accelerator(**result.to_accelerate())``
takes its FSDP2 or DeepSpeed plugin, precision and accumulation, and the DataLoader its micro-batch. On a machine
without GPUs accelerate runs DDP over CPU processes, so the plan is pinned to ddp there. ``bigtrain.check_memory``
logs the measured peak beside the prediction after the second step.

The loss is normalised by the tokens of the whole global batch, as ``bigtrain train`` does: each micro-batch's
summed token loss over the step's label count (gathered from every rank), times the ranks (DDP averages gradients)
and the accumulation steps (``accelerator.backward`` divides by them). Two accelerate defaults are stepped around:
the scheduler is not prepared (a prepared one steps once per process per optimizer step), and the rows arrive in
bigtrain's order (bigtrain/api/same_run.py), so this loop trains the same model as ``bigtrain train``.
"""

from __future__ import annotations

import argparse
import logging

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

import bigtrain
from bigtrain.api.same_run import (
    end_training,
    hf_examples,
    plan_this_job,
    save_final_weights,
    step_order,
    summary_line,
    training_rows,
)
from bigtrain.config.load import load_recipe
from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.losses.causal_lm import labeled_loss_sum
from bigtrain.models.build import load_hf_config
from bigtrain.train.optim import build_optimizer, build_scheduler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    cli = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = load_recipe(cli.recipe, cli.overrides)
    result = plan_this_job(cfg)  # bigtrain.plan(recipe=cfg) for this job (ddp on CPUs), its table printed once
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), **result.to_accelerate())
    torch.manual_seed(cfg.train.seed)
    if cfg.model.name_or_path:
        model = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path)
    else:
        model = AutoModelForCausalLM.from_config(load_hf_config(cfg.model))
    if result.plan.activation_checkpointing == "full":
        model.gradient_checkpointing_enable()
    data = training_rows(cfg)
    examples = hf_examples(data, step_order(data.num_rows, cfg))
    loader = DataLoader(examples, batch_size=result.micro_batch_size, shuffle=False)
    optimizer = build_optimizer(list(model.parameters()), cfg.train)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    scheduler = build_scheduler(optimizer, cfg.train)  # not prepared: stepped once per optimizer step
    accum = result.gradient_accumulation_steps
    batches = iter(loader)
    losses, norms = [], []
    for step in range(cfg.train.steps):
        micro = [next(batches) for _ in range(accum)]
        tokens = sum((b["labels"][:, 1:] != IGNORE_INDEX).sum() for b in micro)
        global_tokens = accelerator.reduce(tokens.to(accelerator.device), reduction="sum")
        step_loss = torch.zeros((), device=accelerator.device)
        for batch in micro:
            with accelerator.accumulate(model):
                logits = model(input_ids=batch["input_ids"], position_ids=batch.get("position_ids")).logits
                # HF labels: the next token of each position is the label one to the right
                loss_sum = labeled_loss_sum(logits[:, :-1], batch["labels"][:, 1:])
                accelerator.backward(loss_sum / global_tokens * accelerator.num_processes * accum)
                step_loss += loss_sum.detach()
                if accelerator.sync_gradients:  # the norm before clipping, as bigtrain logs it
                    norms.append(accelerator.clip_grad_norm_(model.parameters(), cfg.train.grad_clip).item())
                optimizer.step()  # prepared: skipped until the last micro-step of the step
                optimizer.zero_grad()
        scheduler.step()
        losses.append((accelerator.reduce(step_loss, reduction="sum") / global_tokens).item())
        if step + 1 == min(2, cfg.train.steps):
            check = bigtrain.check_memory(result, accelerator.device, logs=accelerator.is_main_process)
    if accelerator.is_main_process:
        kind, world = accelerator.distributed_type, accelerator.num_processes
        weights = save_final_weights(accelerator.unwrap_model(model), cfg.output_dir)
        print(summary_line(result, kind, world, losses, check, norms, weights))
    end_training(accelerator)  # every rank's collectives done, then the group torn down


if __name__ == "__main__":
    main()
