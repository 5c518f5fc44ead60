"""Checks of a model against the rows it will train on, before any process group: the row length against its
positions, and that packed documents stay apart in its attention."""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from bigtrain.config.hf import one_block
from bigtrain.errors import ConfigError

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
