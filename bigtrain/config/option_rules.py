"""Rows of the capability table (``capabilities.py``) about train-level options and what they change in the model:
the chunked loss, activation offload, the router loss, compile, and the adapter methods (LoRA, QLoRA)."""

from __future__ import annotations

from bigtrain.config.schema import ADAPTER_METHODS
from bigtrain.config.setup import Setup


def chunked_loss_with_tp(s: Setup) -> str | None:
    if s.plan.loss_chunk_tokens and s.plan.tp > 1:
        return (
            f"parallel.loss_chunk_tokens={s.plan.loss_chunk_tokens} with parallel.tp > 1 is not built yet; under tp, "
            "parallel.loss_parallel=true divides the logits over the tp ranks instead"
        )
    return None


def chunked_loss_with_pp(s: Setup) -> str | None:
    if s.plan.loss_chunk_tokens and s.plan.pp > 1:
        return f"parallel.loss_chunk_tokens={s.plan.loss_chunk_tokens} with parallel.pp > 1 is not built yet"
    return None


def chunked_loss_keeps_logit_transform(s: Setup) -> str | None:
    key = s.model.logits_after_head
    if s.plan.loss_chunk_tokens and key is not None:
        return (
            f"parallel.loss_chunk_tokens: this model's forward applies {key} to the logits after the LM head, which "
            "a chunked loss would skip; set parallel.loss_chunk_tokens=0"
        )
    return None


def offload_activations_with_selective(s: Setup) -> str | None:
    if s.plan.offload_activations and s.plan.activation_checkpointing == "selective":
        return (
            "parallel.offload_activations=true with activation_checkpointing=selective is not built: what selective "
            "keeps sits in torch's checkpoint cache, which the offload cannot move; use full (offloads each block's "
            "input) or none (offloads everything a block saves)"
        )
    return None


def offload_activations_with_pp(s: Setup) -> str | None:
    if s.plan.offload_activations and s.plan.pp > 1:
        return (
            "parallel.offload_activations=true with parallel.pp > 1 is not built yet (a schedule interleaves the "
            "micro-batches' blocks, which its fetch-ahead does not follow); use activation_checkpointing instead"
        )
    return None


def router_loss_with_pp_or_cp(s: Setup) -> str | None:
    if s.model is None or not s.model.router_loss or (s.plan.pp == 1 and s.plan.cp == 1):
        return None
    other = f"parallel.pp={s.plan.pp}" if s.plan.pp > 1 else f"parallel.cp={s.plan.cp}"
    return (
        f"{other} with the router's load-balancing loss of {s.model.model_type} (output_router_logits) is not built "
        "yet: a stage or a slice of a row would see only part of each forward's routing; set "
        "output_router_logits=false in the model config or that degree to 1"
    )


def compile_with_deepspeed(s: Setup) -> str | None:
    if s.train.compile is True and s.plan.backend == "deepspeed":
        return (
            "train.compile=true compiles decoder blocks for the torch-native engines; the deepspeed backend does "
            "not compile them yet: set train.compile=false or use backend fsdp2"
        )
    return None


def qlora_computes_in_bf16(s: Setup) -> str | None:
    if s.train.method == "qlora" and s.train.mixed_precision != "bf16":
        return (
            f"train.method=qlora dequantises its 4-bit base to bf16 for every matmul; train.mixed_precision="
            f"{s.train.mixed_precision} cannot be its compute dtype: set train.mixed_precision=bf16, or use "
            "method lora"
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
