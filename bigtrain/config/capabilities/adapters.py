"""``train.method: lora | qlora``: a frozen base (bf16, or NF4 under QLoRA) trained through peft's LoRA adapters."""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, row
from bigtrain.config.schema import ADAPTER_METHODS
from bigtrain.config.setup import Setup


def qlora_computes_in_bf16(s: Setup) -> str | None:
    if s.train.method == "qlora" and s.train.mixed_precision != "bf16":
        return (
            f"train.method=qlora dequantises its 4-bit base to bf16 for every matmul; train.mixed_precision="
            f"{s.train.mixed_precision} cannot be its compute dtype: set train.mixed_precision=bf16, or use "
            "method lora"
        )
    return None


def adapters_without_block_linears(s: Setup) -> str | None:
    if s.train.method in ADAPTER_METHODS and s.model is not None and not s.model.block_linears:
        return (
            f"train.method={s.train.method}: {s.model.model_type} has no linear layer in its blocks (a CNN's are "
            "convolutions), and LoRA here adapts linears; train it with train.method=full"
        )
    return None


def adapters_with_tp(s: Setup) -> str | None:
    if s.train.method in ADAPTER_METHODS and s.plan.tp > 1:
        return (
            f"train.method={s.train.method} with parallel.tp={s.plan.tp} is not built yet (peft's adapter layers are "
            "not mapped onto tp's column/row styles); use parallel.tp=1: FSDP2 shards the frozen base instead"
        )
    return None


def adapters_with_pp(s: Setup) -> str | None:
    if s.train.method in ADAPTER_METHODS and s.plan.pp > 1:
        return (
            f"train.method={s.train.method} with parallel.pp={s.plan.pp} is not built yet; use parallel.pp=1: FSDP2 "
            "shards the frozen base instead"
        )
    return None


def qlora_with_deepspeed(s: Setup) -> str | None:
    if s.train.method == "qlora" and s.plan.backend == "deepspeed":
        return (
            "train.method=qlora with backend deepspeed is not built yet (DeepSpeed converts the model to its own "
            "dtype and partitions, which the NF4 base is not); use backend fsdp2 (it shards the 4-bit base) or ddp"
        )
    return None


def qlora_fsdp2_shards(s: Setup) -> str | None:
    if s.train.method == "qlora" and s.plan.backend == "fsdp2" and s.plan.dp_shard * s.plan.cp < 2:
        return (
            "train.method=qlora with backend fsdp2 needs parallel.dp_shard of 2 or more (torchao's NF4 all-gather "
            "has no single-shard path); use backend ddp for one rank or pure replication"
        )
    return None


CAPABILITY = Capability(
    name="adapters",
    summary="LoRA and QLoRA (peft adapters over a frozen bf16 or NF4 base), method auto weighed by the planner",
    keys=("train.method", "lora.r", "lora.alpha", "lora.dropout", "lora.target_modules", "lora.modules_to_save"),
    rules=(
        row(qlora_computes_in_bf16, "invalid"),
        row(adapters_without_block_linears, "invalid", reads_model=True),
        row(adapters_with_tp, "not_built"),
        row(adapters_with_pp, "not_built"),
        row(qlora_with_deepspeed, "not_built"),
        row(qlora_fsdp2_shards, "fit"),
    ),
    transforms=("adapters",),
)
