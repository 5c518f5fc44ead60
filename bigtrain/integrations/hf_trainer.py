"""A plan and a recipe as ``transformers.TrainingArguments`` keyword arguments (a JSON object).

The recipe's training values map one to one: per-device batch, accumulation, steps, AdamW (``adamw_torch``) and
its hyper-parameters, warmup and the schedule (cosine down to ``min_lr_ratio`` is HF's ``cosine_with_min_lr``),
clipping, precision, seed, checkpoint interval. The plan becomes ``fsdp``/``fsdp_config`` (FSDP2, the model's block
class, reshard after forward for zero_stage 3, CPU offload, activation checkpointing), or ``deepspeed`` (the complete
DeepSpeed JSON of ``deepspeed_json`` without ``train_batch_size``: DeepSpeed derives it on the world it runs on,
and the Trainer checks every other batch value against its own arguments), or nothing for ddp. Hybrid
sharding and tp go into ``parallelism_config`` as the keyword arguments of accelerate's ``ParallelismConfig``
(``TrainingArguments`` takes the object, which JSON cannot hold: build it with ``ParallelismConfig(**value)``).
Pipeline stages are refused: the Trainer has no pipeline-parallel training.
"""

from __future__ import annotations

from typing import Any

from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.integrations import Export, dropped_tp_options, refuse_pipeline
from bigtrain.integrations.deepspeed_json import export_deepspeed

# train.log_to -> the Trainer's report_to: the same tracker (metrics.jsonl is bigtrain's own, the Trainer has none)
REPORT_TO = {"jsonl": "none", "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
TRACKER_NOTES = {  # where bigtrain keeps the tracker's store on the machine, the Trainer leaves to the library
    "wandb": "report_to=wandb: bigtrain logs an offline run; for the Trainer to do the same, set WANDB_MODE=offline",
    "mlflow": "report_to=mlflow: bigtrain logs to the SQLite store output_dir/mlflow.db; for the Trainer to do the "
    "same, set MLFLOW_TRACKING_URI=sqlite:///<output_dir>/mlflow.db",
}


def export_hf_trainer(cfg: RecipeConfig, plan: Plan, hf_config: Any, block_classes: list[str]) -> Export:
    refuse_pipeline(plan, "hf-trainer", "the Trainer has no pipeline-parallel training")
    train = cfg.train
    kwargs: dict[str, Any] = {
        "output_dir": cfg.output_dir,
        "max_steps": train.steps,
        "per_device_train_batch_size": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum_steps(train.global_batch_size),
        "learning_rate": train.lr,
        "optim": "adamw_torch",
        "weight_decay": train.weight_decay,
        "adam_beta1": train.adam_beta1,
        "adam_beta2": train.adam_beta2,
        "adam_epsilon": train.adam_eps,
        "warmup_steps": train.warmup_steps,
        "max_grad_norm": train.grad_clip,
        "bf16": train.mixed_precision == "bf16",
        "fp16": train.mixed_precision == "fp16",
        "seed": train.seed,
        "save_strategy": "steps" if cfg.checkpoint.every else "no",
        # every: auto is decided during the run; the Trainer takes a number (its default)
        "save_steps": cfg.checkpoint.every if isinstance(cfg.checkpoint.every, int) and cfg.checkpoint.every else 500,
        "save_total_limit": cfg.checkpoint.keep,
        "logging_steps": 1,
        "report_to": REPORT_TO[train.log_to],
    }
    if train.compile is True:  # the Trainer compiles the whole model; bigtrain compiles each block and the loss
        kwargs["torch_compile"] = True
    if train.lr_schedule == "cosine":
        kwargs["lr_scheduler_type"] = "cosine_with_min_lr"
        kwargs["lr_scheduler_kwargs"] = {"min_lr_rate": train.min_lr_ratio}
    else:
        kwargs["lr_scheduler_type"] = "constant_with_warmup"
    notes: list[str] = [TRACKER_NOTES[train.log_to]] if train.log_to in TRACKER_NOTES else []
    if plan.backend == "deepspeed":
        export = export_deepspeed(cfg, plan, hf_config)
        # DeepSpeed derives it from the micro-batch, the accumulation and the world it runs on; a stated value
        # would be checked against the world size TrainingArguments sees when it is made (1 before the process
        # group exists), which fails for every multi-rank job
        del export.content["train_batch_size"]
        kwargs["deepspeed"] = export.content
        kwargs["activation_checkpointing"] = plan.activation_checkpointing == "full"
        notes += export.notes
    elif plan.backend == "fsdp2":
        kwargs["fsdp"] = True
        kwargs["fsdp_config"] = {
            "version": 2,
            "transformer_layer_cls_to_wrap": block_classes,
            "reshard_after_forward": plan.zero_stage == 3,
            "cpu_offload": plan.offload_params,
            "activation_checkpointing": plan.activation_checkpointing == "full",
            "state_dict_type": "SHARDED_STATE_DICT",
        }
        if plan.dp_replicate > 1 or plan.tp > 1:
            kwargs["parallelism_config"] = {
                "dp_replicate_size": plan.dp_replicate,
                "dp_shard_size": plan.dp_shard,
                "tp_size": plan.tp,
            }
            notes.append(
                "parallelism_config holds the keyword arguments of accelerate's ParallelismConfig: TrainingArguments "
                "takes the object, ParallelismConfig(**value) (bigtrain.plan(...).to_training_arguments() does this)"
            )
        notes += dropped_tp_options(plan, "hf-trainer")
    else:
        kwargs["activation_checkpointing"] = plan.activation_checkpointing == "full"
    return Export(kwargs, notes)
