"""A plan handed to other tools: ``bigtrain export RECIPE --to accelerate|deepspeed|hf-trainer``.

One module per target, each a pure function of the recipe, the resolved plan and the model's config that returns
the file's content: ``accelerate_config`` (an ``accelerate launch --config_file`` YAML), ``deepspeed_json`` (a
complete DeepSpeed config) and ``hf_trainer`` (``TrainingArguments`` keyword arguments). A plan the target cannot
express is a ConfigError naming the key; a translation that keeps the model but changes memory (DeepSpeed ZeRO-2
for FSDP2's zero_stage 2, tp without sequence parallelism) is kept and said in ``Export.notes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.errors import ConfigError

TARGETS = ("accelerate", "deepspeed", "hf-trainer")


@dataclass
class Export:
    """What a target makes of a plan: the file's content, and what the user should know about the translation."""

    content: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    batch_noun: str = "sequences"  # what the global batch counts (the job's: sequences, images, examples, pairs)


def refuse_pipeline(plan: Plan, target: str, why: str) -> None:
    """No target trains pipeline stages or context-parallel slices as bigtrain does: a pp or cp plan is one error
    naming the key and the way out."""
    if plan.pp > 1:
        raise ConfigError(
            f"parallel.pp={plan.pp} cannot be exported --to {target}: {why}; export a plan with pp=1 "
            "(e.g. --set parallel.pp=1), or run it with bigtrain train"
        )
    if plan.cp > 1:
        raise ConfigError(
            f"parallel.cp={plan.cp} cannot be exported --to {target}: bigtrain's context parallelism (all-to-all "
            "around transformers' attention) has no key there; export a plan with cp=1, or run it with bigtrain train"
        )


def dropped_memory_options(plan: Plan, target: str) -> list[str]:
    """Notes for bigtrain's activation-memory levers no target expresses: the same model trains without them, with
    more activation memory than the plan was sized for."""
    dropped = []
    if plan.loss_chunk_tokens:
        dropped.append(f"parallel.loss_chunk_tokens={plan.loss_chunk_tokens}")
    if plan.activation_checkpointing == "selective":
        dropped.append("parallel.activation_checkpointing=selective (exported as none)")
    if plan.checkpoint_every > 1 and plan.activation_checkpointing == "full":
        dropped.append(f"parallel.checkpoint_every={plan.checkpoint_every} (exported as every block)")
    if plan.offload_activations:
        dropped.append("parallel.offload_activations=true")
    if not dropped:
        return []
    return [
        f"{'; '.join(dropped)}: no {target} key; the same model trains, its activation memory differs from the plan's"
    ]


def dropped_tp_options(plan: Plan, target: str) -> list[str]:
    """Notes for sequence and loss parallelism, which neither accelerate nor the Trainer can express: tp without
    them trains the same model (checked by the equivalence tests) with more activation memory."""
    dropped = [key for key in ("sequence_parallel", "loss_parallel") if getattr(plan, key)]
    if not dropped:
        return []
    return [
        f"{' and '.join('parallel.' + k for k in dropped)} have no {target} key and are left out: tp={plan.tp} "
        "trains the same model with more activation memory per GPU than the plan was sized for"
    ]


def speed_notes(cfg: RecipeConfig, target: str) -> list[str]:
    """Notes for the train options a target does not carry: FP8 linears everywhere, compile for DeepSpeed (the HF
    Trainer and accelerate carry ``train.compile`` as their own torch.compile switch)."""
    notes = []
    if cfg.train.fp8 not in ("none", "auto"):
        notes.append(
            f"train.fp8={cfg.train.fp8} has no {target} key here: the model trains with bf16 matmuls, slower than "
            "the plan was timed for (torchao's convert_to_float8_training in your script would add them)"
        )
    if cfg.train.compile is True and target == "deepspeed":
        notes.append("train.compile=true has no deepspeed key here: call torch.compile on the blocks in your script")
    return notes
