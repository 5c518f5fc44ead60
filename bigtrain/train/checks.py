"""Start-up checks of a training job that need the model or the data (the recipe alone is checked in config/): run
on every rank before the process group exists, so a bad input fails everywhere within seconds with one line."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from bigtrain.config.hf import one_block
from bigtrain.config.plan import Plan
from bigtrain.errors import ConfigError
from bigtrain.planner.memory_terms import GiB, offloaded_block_bytes, rank_seq_len
from bigtrain.planner.model_stats import ModelStats

log = logging.getLogger("bigtrain")


def learned_position_rows(model: nn.Module) -> int | None:
    """Rows of the model's learned absolute position embedding (GPT-2's ``wpe``), or None with rotary positions."""
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, nn.Embedding) and ("position" in leaf or leaf == "wpe"):
            return int(module.num_embeddings)
    return None


def check_sequence_length(
    hf_config: Any, probe: nn.Module, seq_len: int, is_main: bool, key: str = "data.seq_len"
) -> None:
    """A sequence longer than a learned position table cannot be embedded (GPT-2 fails with an IndexError deep in
    the forward): refused. Rotary models run past ``max_position_embeddings`` but were not trained there: a
    warning."""
    rows = learned_position_rows(probe)
    if rows is not None and seq_len > rows:
        raise ConfigError(
            f"{key}={seq_len} exceeds the model's {rows} learned positions ({hf_config.model_type}); use "
            f"{key} <= {rows}"
        )
    limit = getattr(hf_config, "max_position_embeddings", None)
    if rows is None and limit is not None and seq_len > limit and is_main:
        log.warning(
            "%s=%d is beyond the model's max_position_embeddings=%d: rotary positions run there, but the model was "
            "not trained on them; extend the context deliberately (rope scaling) or shorten %s",
            key,
            seq_len,
            limit,
            key,
        )


def check_enough_rows(rows: int, global_batch: int, data_path: str) -> None:
    """Fewer sequences than one global batch would repeat sequences within a step."""
    if rows < global_batch:
        raise ConfigError(
            f"data.path={data_path!r} gives {rows} sequence(s), fewer than one global batch of "
            f"train.global_batch_size={global_batch}; use more data, a shorter data.seq_len, or a batch <= {rows}"
        )


def check_writable(output_dir: str) -> None:
    """output_dir (or the nearest folder that exists above it) must accept files: found now, not at the first
    checkpoint after the process group exists."""
    path = Path(output_dir).resolve()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ConfigError(f"output_dir={output_dir!r}: {str(existing)!r} is a file, not a folder; choose another path")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".bigtrain-write-test-"):
            pass
    except OSError as e:
        raise ConfigError(
            f"output_dir={output_dir!r} is not writable ({e.strerror or e}: {str(existing)!r}); choose a folder you "
            "can write to"
        ) from e


PACKING_CHECK_WIDTH = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}


def check_packed_attention(hf_config: Any, attn_implementation: str) -> str | None:
    """``data.packing: documents`` relies on the model turning restarting position ids into attention that stays
    inside each record. transformers' mask builder does (checked for Llama, Qwen2, Mistral, GPT-2), but a model
    family with its own attention code might not: measured here, on a one-block, 64-wide copy of the model's family
    on the CPU (~0.1 s), by comparing a record's logits packed behind another with its logits alone. Refused if they
    differ; returns a warning when the check cannot run (flash attention needs a GPU; a family that does not build
    narrow)."""
    import torch
    from transformers import AutoModelForCausalLM

    if attn_implementation not in ("sdpa", "eager"):
        return (
            f"data.packing=documents with model.attn_implementation={attn_implementation}: transformers passes the "
            "restarting position ids to its variable-length kernel; not checked on this machine"
        )
    tiny = one_block(hf_config)
    try:
        for key, value in {**PACKING_CHECK_WIDTH, "intermediate_size": 128}.items():
            if getattr(tiny, key, None) is not None:
                try:
                    setattr(tiny, key, value)
                except AttributeError:  # derived in this family's config (Falcon's head_dim)
                    pass
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny, attn_implementation=attn_implementation, dtype=torch.float32)
        model.eval()
        vocab = int(tiny.vocab_size)
        first = torch.arange(5).remainder(vocab).unsqueeze(0)
        second = torch.arange(7, 14).remainder(vocab).unsqueeze(0)
        positions = torch.cat([torch.arange(5), torch.arange(7)]).unsqueeze(0)
        with torch.no_grad():
            packed = model(input_ids=torch.cat([first, second], 1), position_ids=positions, use_cache=False).logits
            alone = model(input_ids=second, use_cache=False).logits
    except Exception as e:  # noqa: BLE001 - a best-effort probe: any failure means "not checked", said in a warning
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return (
            f"data.packing=documents: could not check that {hf_config.model_type} keeps packed records apart ({reason})"
        )
    if not torch.allclose(packed[:, 5:], alone, atol=1e-4, rtol=1e-4):
        raise ConfigError(
            f"data.packing=documents: {hf_config.model_type} with attn_implementation={attn_implementation} lets a "
            "packed record attend to the one before it (its attention ignores restarting position ids); use "
            "data.packing: pad"
        )
    return None


def check_offload_host_memory(
    plan: Plan, hf_config: Any, seq_len: int, dtype_bytes: int, local_ranks: int, available: int
) -> None:
    """``parallel.offload_activations`` needs host memory for one micro-batch's saved activations on every rank of
    the node (the planner's ``offloaded_block_bytes``): refused when ``available`` (the node's free memory) is short,
    before anything is allocated."""
    if not plan.offload_activations:
        return
    try:
        stats = ModelStats.from_config({**hf_config.to_dict(), "model_type": hf_config.model_type})
    except ConfigError:  # a family the planner does not model: nothing to predict with
        return
    rank_seq = rank_seq_len(plan, seq_len)
    need = offloaded_block_bytes(stats, plan, rank_seq, dtype_bytes, stats.layers)
    if need * local_ranks <= available:
        return
    full = offloaded_block_bytes(
        stats, replace(plan, activation_checkpointing="full", checkpoint_every=1), rank_seq, dtype_bytes, stats.layers
    )
    raise ConfigError(
        f"parallel.offload_activations=true keeps {need / GiB:.1f} GiB per rank in host memory "
        f"({need * local_ranks / GiB:.1f} GiB for the {local_ranks} ranks of this node), but only "
        f"{available / GiB:.1f} GiB is free; with activation_checkpointing: full it keeps {full / GiB:.1f} GiB per "
        "rank (the blocks' inputs only), or lower parallel.micro_batch_size or data.seq_len"
    )
