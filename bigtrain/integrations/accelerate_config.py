"""A plan as an ``accelerate launch --config_file`` YAML (accelerate 1.x keys).

- ddp: ``MULTI_GPU``.
- fsdp2: the FSDP plugin at ``fsdp_version: 2``, wrapping the model's decoder-block class, ``reshard_after_forward``
  for zero_stage 3, parameters offloaded for offload_params, activation checkpointing; hybrid sharding and tensor
  parallelism as ``parallelism_config`` (dp_replicate × dp_shard × tp). accelerate has no key for sequence or loss
  parallelism: both are left out with a note (the same model, more activation memory per GPU).
- deepspeed: the DeepSpeed plugin's own keys (stage, accumulation, clipping, offload devices, ``zero3_init_flag``).

What the YAML cannot hold (the micro-batch size, the accumulation of the FSDP and DDP routes, the optimizer) is the
training script's, and the file's header comment says which values the plan chose. Pipeline stages are refused:
accelerate has no pipeline-parallel training.
"""

from __future__ import annotations

from typing import Any

import yaml

from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.errors import ConfigError
from bigtrain.integrations import Export, dropped_tp_options, refuse_pipeline

MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


def export_accelerate(cfg: RecipeConfig, plan: Plan, block_classes: list[str], gpus_per_node: int) -> Export:
    """The accelerate config (a dict to write as YAML) for ``plan`` on nodes of ``gpus_per_node`` GPUs."""
    refuse_pipeline(plan, "accelerate", "accelerate has no pipeline-parallel training")
    world = plan.world_size
    per_node = min(gpus_per_node, world)
    if world % per_node:
        raise ConfigError(
            f"the plan's {world} GPUs do not fill whole nodes of {per_node} (--gpus-per-node); accelerate launches "
            "the same number of processes on every machine"
        )
    content: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "NO",
        "mixed_precision": MIXED_PRECISION[cfg.train.mixed_precision],
        "num_machines": world // per_node,
        "num_processes": world,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
        "downcast_bf16": "no",
    }
    if cfg.train.compile is True:  # each repeated block compiled once, as bigtrain compiles its blocks
        content["dynamo_config"] = {"dynamo_backend": "INDUCTOR", "dynamo_use_regional_compilation": True}
    notes: list[str] = []
    if plan.backend == "deepspeed":
        content["distributed_type"] = "DEEPSPEED"
        content["deepspeed_config"] = _deepspeed_plugin(cfg, plan)
        if plan.activation_checkpointing == "full":
            notes.append("activation checkpointing: call model.gradient_checkpointing_enable() in the script")
    elif plan.backend == "fsdp2":
        content["distributed_type"] = "FSDP"
        content["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": ",".join(block_classes),
            "fsdp_reshard_after_forward": plan.zero_stage == 3,
            "fsdp_offload_params": plan.offload_params,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_activation_checkpointing": plan.activation_checkpointing == "full",
        }
        if plan.dp_replicate > 1 or plan.tp > 1:
            content["parallelism_config"] = {
                "parallelism_config_dp_replicate_size": plan.dp_replicate,
                "parallelism_config_dp_shard_size": plan.dp_shard,
                "parallelism_config_tp_size": plan.tp,
                "parallelism_config_cp_size": 1,
            }
        notes += dropped_tp_options(plan, "accelerate")
    elif world > 1:
        content["distributed_type"] = "MULTI_GPU"
        if plan.activation_checkpointing == "full":
            notes.append("activation checkpointing: call model.gradient_checkpointing_enable() in the script")
    return Export(content, notes)


def _deepspeed_plugin(cfg: RecipeConfig, plan: Plan) -> dict[str, Any]:
    return {
        "zero_stage": plan.zero_stage,
        "gradient_accumulation_steps": plan.grad_accum_steps(cfg.train.global_batch_size),
        "gradient_clipping": cfg.train.grad_clip,
        "offload_optimizer_device": "cpu" if plan.offload_optimizer else "none",
        "offload_param_device": "cpu" if plan.offload_params else "none",
        "zero3_init_flag": plan.zero_stage == 3,
        "zero3_save_16bit_model": plan.zero_stage == 3,
    }


def header(cfg: RecipeConfig, plan: Plan, recipe: str, batch_noun: str = "sequences") -> str:
    """Comment lines for the YAML: what the training script must set itself."""
    accum = plan.grad_accum_steps(cfg.train.global_batch_size)
    train = cfg.train
    lines = [
        f"accelerate launch --config_file THIS_FILE, exported by bigtrain from {recipe}",
        f"plan: {_describe(plan)}",
        "the training script sets what this file cannot hold:",
        f"  per-process micro-batch {plan.micro_batch_size}, gradient accumulation {accum} "
        f"(Accelerator(gradient_accumulation_steps={accum})), global batch {train.global_batch_size} {batch_noun}",
        f"  AdamW lr {train.lr:g} betas ({train.adam_beta1:g}, {train.adam_beta2:g}) eps {train.adam_eps:g} "
        f"weight decay {train.weight_decay:g}; {train.warmup_steps} warmup steps, {train.lr_schedule} schedule, "
        f"{train.steps} steps; clip the gradient norm at {train.grad_clip:g}",
    ]
    return "".join(f"# {line}\n" for line in lines)


def _describe(plan: Plan) -> str:
    parts = [f"backend {plan.backend}", f"zero_stage {plan.zero_stage}", f"dp_replicate {plan.dp_replicate}"]
    parts += [f"dp_shard {plan.dp_shard}", f"tp {plan.tp}", f"activation_checkpointing {plan.activation_checkpointing}"]
    return ", ".join(parts)


def to_yaml(export: Export, cfg: RecipeConfig, plan: Plan, recipe: str) -> str:
    return header(cfg, plan, recipe, export.batch_noun) + yaml.safe_dump(export.content, sort_keys=False)
