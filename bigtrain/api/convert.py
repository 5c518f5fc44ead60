"""A plan as the live objects other tools take: ``TrainingArguments``, TRL's ``SFTConfig``, ``Accelerator`` keyword
arguments (its FSDP / DeepSpeed plugin and ``ParallelismConfig``), a DeepSpeed config dict.

Each takes the plan as a recipe runs it (``cfg``: the recipe with ``parallel`` set to ``plan``) and the model's
config, and starts from the plain-data translation ``bigtrain export`` writes to a file (``integrations/``), so a
file and an object made from one plan say the same. The translation's notes (what a target cannot say) are logged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bigtrain.api.request import planning
from bigtrain.config.capabilities import CAPABILITIES, ModelFacts, Setup, check
from bigtrain.config.capabilities.reference import resolved_reference
from bigtrain.config.hf import model_config_object
from bigtrain.config.plan import Plan
from bigtrain.config.resolve import recipe_data_facts
from bigtrain.config.schema import ADAPTER_METHODS, RecipeConfig
from bigtrain.errors import ConfigError
from bigtrain.integrations import TARGETS, Export, dropped_memory_options, speed_notes
from bigtrain.job import OBJECTIVES, resolve_job
from bigtrain.objectives.pairs import beta_of

if TYPE_CHECKING:
    from transformers import TrainingArguments

log = logging.getLogger("bigtrain")


@planning
def export(
    cfg: RecipeConfig, plan: Plan, model_config: dict[str, Any], target: str, gpus_per_node: int | None = None
) -> Export:
    """The plan for ``target`` as plain data and the notes on its translation (what ``bigtrain export`` writes)."""
    from bigtrain.integrations.accelerate_config import export_accelerate
    from bigtrain.integrations.deepspeed_json import export_deepspeed
    from bigtrain.integrations.hf_trainer import export_hf_trainer
    from bigtrain.models.build import block_class_names

    if target not in TARGETS:
        raise ConfigError(f"target {target!r} is not one of {', '.join(TARGETS)}")
    hf_config = model_config_object(dict(model_config))
    job, hf_config = resolve_job(cfg, hf_config)
    extra = job.task.model_facts(hf_config) if job.task.model_facts is not None else {}
    # the rows that read the model, the data and the job, as start-up asks them
    facts = ModelFacts.of(hf_config, **extra)
    check(Setup(plan, cfg.train, facts, recipe_data_facts(cfg, hf_config), job.facts))
    per_node = gpus_per_node or min(plan.world_size, 8)
    if per_node < 1:
        raise ConfigError(f"--gpus-per-node {per_node} must be at least 1")
    if target == "accelerate":
        out = export_accelerate(cfg, plan, block_class_names(hf_config), per_node)
    elif target == "deepspeed":
        out = export_deepspeed(cfg, plan, hf_config)
    else:
        out = export_hf_trainer(cfg, plan, hf_config, block_class_names(hf_config))
    out.batch_noun = job.batch_noun
    out.notes += dropped_memory_options(plan, target) + speed_notes(cfg, target)
    out.notes += [note for c in CAPABILITIES if c.export_note and (note := c.export_note(target, plan))]
    if cfg.train.method in ADAPTER_METHODS:
        out.notes.append(_adapter_note(cfg, target, hf_config))
    return out


def _adapter_note(cfg: RecipeConfig, target: str, hf_config: Any) -> str:
    """How to add the adapters the recipe trains (a diffusion transformer's default targets: its attention
    projections, which bigtrain adapts; peft's 'all-linear' reads transformers models only)."""
    from bigtrain.config.diffusers_types import CLASSES, LORA_TARGETS

    lora = cfg.lora
    default = list(LORA_TARGETS) if getattr(hf_config, "model_type", None) in CLASSES else "all-linear"
    return (
        f"train.method={cfg.train.method}: the adapters are not part of a {target} config; wrap the model with "
        f"peft in your script (LoraConfig(r={lora.r}, lora_alpha={lora.alpha:g}, lora_dropout={lora.dropout:g}, "
        f"target_modules={lora.target_modules or default!r}"
        + (f", modules_to_save={lora.modules_to_save!r}" if lora.modules_to_save else "")
        + ")"
        + (", the base loaded 4-bit NF4" if cfg.train.method == "qlora" else "")
        + "); this file carries the parallel plan"
    )


def _logged(out: Export) -> Export:
    """The notes logged once per job (by rank 0 under a launcher), the export returned."""
    from bigtrain.runtime import read_launch_env

    if read_launch_env().rank == 0:
        for note in out.notes:
            log.warning("bigtrain: %s", note)
    return out


def to_deepspeed(cfg: RecipeConfig, plan: Plan, model_config: dict[str, Any]) -> dict[str, Any]:
    if plan.backend != "deepspeed":
        raise ConfigError(
            f"the plan's backend is {plan.backend}, not deepspeed; plan with fix={{'backend': 'deepspeed'}} "
            "for a DeepSpeed config"
        )
    return _logged(export(cfg, plan, model_config, "deepspeed")).content


def trainer_keywords(
    cfg: RecipeConfig, plan: Plan, model_config: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    """``TrainingArguments`` keywords for the plan with ``overrides`` applied, ``parallelism_config`` as the object."""
    kwargs = {**_logged(export(cfg, plan, model_config, "hf-trainer")).content, **overrides}
    if isinstance(kwargs.get("parallelism_config"), dict):
        from accelerate.parallelism_config import ParallelismConfig

        kwargs["parallelism_config"] = ParallelismConfig(**kwargs["parallelism_config"])
    return kwargs


def to_training_arguments(
    cfg: RecipeConfig, plan: Plan, model_config: dict[str, Any], overrides: dict[str, Any]
) -> TrainingArguments:
    from transformers import TrainingArguments

    with _built_where_it_trains(plan, cfg):
        return TrainingArguments(**trainer_keywords(cfg, plan, model_config, overrides))


def to_sft_config(cfg: RecipeConfig, plan: Plan, model_config: dict[str, Any], overrides: dict[str, Any]) -> Any:
    try:
        from trl import SFTConfig
    except ImportError as e:
        raise ConfigError("to_sft_config needs TRL: pip install 'bigtrain[trl]'") from e
    overrides = {"max_length": cfg.data.seq_len, **overrides}
    with _built_where_it_trains(plan, cfg):
        return SFTConfig(**trainer_keywords(cfg, plan, model_config, overrides))


def to_dpo_config(cfg: RecipeConfig, plan: Plan, model_config: dict[str, Any], overrides: dict[str, Any]) -> Any:
    """TRL's ``DPOConfig`` for a dpo/ipo recipe and plan: the Trainer's keywords, ``beta``, ``loss_type``,
    ``max_length`` (data.seq_len) and the reference as TRL holds it: ``precompute_ref_log_probs`` for precomputed;
    otherwise TRL's own (the adapter-disabled base with a peft model, else a copy it prepares with the policy's FSDP
    or DeepSpeed plugin: sharded)."""
    train = cfg.train
    spec = OBJECTIVES.get(train.objective)
    if spec is None or spec.trl_dpo_loss is None:
        raise ConfigError(
            f"to_dpo_config is for train.objective dpo or ipo (TRL's DPOTrainer), not {train.objective}; orpo and "
            "simpo are TRL's ORPOTrainer and CPOTrainer (trl.experimental)"
        )
    if train.label_smoothing:
        raise ConfigError(
            f"train.label_smoothing={train.label_smoothing}: TRL's sigmoid loss has no label smoothing (its robust "
            "loss is another formula); set train.label_smoothing=0 for DPOConfig"
        )
    if cfg.data.max_prompt_length is not None:
        raise ConfigError(
            f"data.max_prompt_length={cfg.data.max_prompt_length}: TRL 1.16's DPOConfig cuts no prompt (only "
            "max_length, keeping the start); unset it so both routes train on the same rows"
        )
    reference = resolved_reference(plan, spec.roles, train.method)
    if reference == "offloaded":
        raise ConfigError(
            "parallel.reference=offloaded has no DPOConfig setting (TRL prepares its reference copy like the policy); "
            "use parallel.reference sharded or precomputed"
        )
    try:
        from trl import DPOConfig
    except ImportError as e:
        raise ConfigError("to_dpo_config needs TRL: pip install 'bigtrain[trl]'") from e
    loss = spec.trl_dpo_loss(train)
    overrides = {
        "max_length": cfg.data.seq_len,
        "beta": beta_of(train),
        "loss_type": [loss],
        "precompute_ref_log_probs": reference == "precomputed",
        **overrides,
    }
    with _built_where_it_trains(plan, cfg):
        return DPOConfig(**trainer_keywords(cfg, plan, model_config, overrides))


@contextlib.contextmanager
def _built_where_it_trains(plan: Plan, cfg: RecipeConfig) -> Iterator[None]:
    """transformers checks the machine that builds TrainingArguments (bf16 or fp16 needs a GPU with it here): a plan
    made on a laptop for a cluster gets bigtrain's words and what to do, not transformers' "doesn't support"."""
    try:
        yield
    except ValueError as e:
        said = str(e)
        if not (("bf16" in said or "fp16" in said.lower()) and ("support" in said or "can only be used" in said)):
            raise
        raise ConfigError(
            f"TrainingArguments with {cfg.train.mixed_precision} mixed precision can only be built on a machine "
            f"with a GPU that has it (transformers checks the machine that builds them, and this one has none): "
            f"build them in the training script on the cluster (the plan travels as result.plan or "
            f"bigtrain export --to hf-trainer), or pass use_cpu=True to try the plan on CPU processes here"
        ) from e


def to_accelerate(cfg: RecipeConfig, plan: Plan, model_config: dict[str, Any]) -> dict[str, Any]:
    """``Accelerator(**kwargs)``: the plugin objects built from the keys ``bigtrain export --to accelerate`` writes."""
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin, TorchDynamoPlugin

    content = _logged(export(cfg, plan, model_config, "accelerate")).content
    kwargs: dict[str, Any] = {
        "mixed_precision": content["mixed_precision"],
        "gradient_accumulation_steps": plan.grad_accum_steps(cfg.train.global_batch_size),
    }
    if "dynamo_config" in content:
        kwargs["dynamo_plugin"] = TorchDynamoPlugin(backend="inductor", use_regional_compilation=True)
    if plan.backend == "fsdp2":
        fsdp = content["fsdp_config"]
        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=fsdp["fsdp_transformer_layer_cls_to_wrap"].split(","),
            reshard_after_forward=fsdp["fsdp_reshard_after_forward"],
            cpu_offload=fsdp["fsdp_offload_params"],
            state_dict_type="SHARDED_STATE_DICT",
            activation_checkpointing=fsdp["fsdp_activation_checkpointing"],
        )
        if "parallelism_config" in content:
            from accelerate.parallelism_config import ParallelismConfig

            kwargs["parallelism_config"] = ParallelismConfig(
                dp_replicate_size=plan.dp_replicate, dp_shard_size=plan.dp_shard, tp_size=plan.tp
            )
    elif plan.backend == "deepspeed":
        # the complete config (the same as to_deepspeed): the plugin reads stage, offload and batch from it
        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=export(cfg, plan, model_config, "deepspeed").content)
    return kwargs
