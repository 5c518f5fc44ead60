"""DPO of a recipe's model on its preference pairs with TRL's ``DPOTrainer``, configured by ``bigtrain.plan``.

    pip install 'bigtrain[trl]'
    torchrun --nproc-per-node 8 recipes/trl_dpo_train.py recipes/dpo_full.yaml

``bigtrain.plan(recipe=...)`` chooses the plan (and the reference, ``parallel.reference``) for the GPUs of the job and
``to_dpo_config`` hands it to TRL: the FSDP or DeepSpeed plugin, batch and accumulation, the recipe's optimizer,
schedule, clipping and precision, ``beta``, ``loss_type``, ``max_length`` (``data.seq_len``) and
``precompute_ref_log_probs`` where the plan precomputes the reference. With ``train.method: lora`` the model is
wrapped by peft with the recipe's lora section, and TRL's reference is the base with the adapters off, as bigtrain's
``adapter_disabled``. On a machine without GPUs the Trainer runs DDP over CPU processes, so the plan is pinned to ddp
there. The data: the recipe's ``data.path`` (a .jsonl of prompt/chosen/rejected, or ``builtin:preferences``).
"""

from __future__ import annotations

import argparse
import logging

import torch
from datasets import Dataset, load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOTrainer

import bigtrain
from bigtrain.api.same_run import end_training, plan_this_job
from bigtrain.config.load import load_recipe
from bigtrain.data.builtin import builtin_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    cli = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = load_recipe(cli.recipe, cli.overrides)
    result = plan_this_job(cfg)  # bigtrain.plan(recipe=cfg) for this job (ddp on CPUs), its table printed once
    args = result.to_dpo_config(
        output_dir=cfg.output_dir,
        use_cpu=not torch.cuda.is_available(),
        log_level="info",
        save_strategy="no",
        dataset_num_proc=None,
    )
    path = cfg.data.path
    if path.startswith("builtin:"):
        pairs = Dataset.from_list(builtin_records(path.removeprefix("builtin:"), 2000))
    else:
        pairs = load_dataset("json", data_files=path, split="train")
    tokenizer = AutoTokenizer.from_pretrained(cfg.data.tokenizer or cfg.model.name_or_path)
    torch.manual_seed(cfg.train.seed)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path)
    peft_config = None
    if cfg.train.method in ("lora", "qlora"):
        from peft import LoraConfig

        lora = cfg.lora
        peft_config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules or "all-linear",
        )
    check = bigtrain.MemoryCheckCallback(result, after_steps=min(2, cfg.train.steps))
    trainer = DPOTrainer(
        model=model,
        args=args,
        train_dataset=pairs,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[check],
    )
    trainer.train()
    if trainer.is_world_process_zero():
        logged = [entry for entry in trainer.state.log_history if "rewards/margins" in entry]
        print(
            f"trl dpo: {len(logged)} steps, loss {logged[0]['loss']:.4f} -> {logged[-1]['loss']:.4f}, "
            f"rewards/margins {logged[-1]['rewards/margins']:.4f}, plan {result.summary()}"
        )
    end_training(trainer.accelerator)


if __name__ == "__main__":
    main()
