"""A plan as a complete DeepSpeed JSON: the same template filling and contradiction checks the deepspeed engine uses
(``config/deepspeed.py``), applied to the plan's DeepSpeed equivalent.

A deepspeed plan is exported as it runs. The others are translated to the ZeRO stage that trains the same model:
ddp is stage 0 (DeepSpeed's plain data parallelism), FSDP2 zero_stage 3 is ZeRO-3, FSDP2 zero_stage 2 is ZeRO-2
(DeepSpeed then keeps whole parameters on every rank between steps, where FSDP2 keeps shards: said in the notes),
FSDP2 offload_params is ZeRO-3 with parameters and optimizer offloaded (FSDP2's CPUOffloadPolicy keeps both on the
host). What a DeepSpeed JSON cannot say is refused: pipeline stages (DeepSpeed's pipeline engine needs the model
rewritten as a PipelineModule), tensor parallelism, and hybrid sharding.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bigtrain.config.deepspeed import bucket_width, deepspeed_config
from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.errors import ConfigError
from bigtrain.integrations import Export, refuse_pipeline


def deepspeed_equivalent(plan: Plan) -> tuple[Plan, list[str]]:
    """The deepspeed-backend plan that trains the same model as ``plan``, and notes on what changes; ConfigError
    when DeepSpeed cannot express it."""
    refuse_pipeline(plan, "deepspeed", "DeepSpeed's pipeline engine needs the model rewritten as a PipelineModule")
    if plan.tp > 1:
        raise ConfigError(
            f"parallel.tp={plan.tp} cannot be exported --to deepspeed: bigtrain has not checked DeepSpeed's AutoTP "
            "(tensor_parallel.autotp_size) against its own tp, so it does not write one; export a plan with tp=1, "
            "or use --to accelerate (parallelism_config tp_size)"
        )
    if plan.backend == "deepspeed":
        return plan, []
    if plan.backend == "fsdp2" and plan.dp_replicate > 1:
        raise ConfigError(
            f"parallel.dp_replicate={plan.dp_replicate} (hybrid sharding) cannot be exported --to deepspeed: "
            "DeepSpeed ZeRO shards over the whole data-parallel world; export with dp_replicate=1"
        )
    notes = []
    if plan.backend == "ddp":
        stage, offload = 0, False
    elif plan.offload_params:
        stage, offload = 3, True
        notes.append(
            "FSDP2 offload_params is exported as ZeRO-3 with offload_param and offload_optimizer on the CPU "
            "(FSDP2 keeps parameters, gradients and the optimizer step on the host)"
        )
    else:
        stage, offload = plan.zero_stage, False
        if stage == 2:
            notes.append(
                "FSDP2 zero_stage 2 is exported as DeepSpeed ZeRO-2, which keeps whole parameters on every rank "
                "(FSDP2 keeps shards between steps): the same model, more memory per GPU"
            )
    dp = plan.dp
    ds_plan = replace(
        plan,
        backend="deepspeed",
        zero_stage=stage,
        dp_replicate=1,
        dp_shard=dp,
        grad_reduce="every_micro_step",
        offload_params=offload,
        offload_optimizer=offload,
    )
    return ds_plan, notes


def export_deepspeed(cfg: RecipeConfig, plan: Plan, hf_config: Any) -> Export:
    """A complete DeepSpeed config for ``plan``: no "auto" left, batch sizes for the plan's data-parallel world."""
    ds_plan, notes = deepspeed_equivalent(plan)
    return Export(deepspeed_config(cfg, ds_plan, bucket_width(hf_config)), notes)
