"""HuggingFace configs from plain dicts: the one place a ``{"model_type": ..., ...}`` mapping becomes a transformers
config (recipes' ``model.config``, planner presets, config.json files, the simulator, the tests' tiny models)."""

from __future__ import annotations

import math
from typing import Any

from bigtrain.config.plan import divisor_hint
from bigtrain.errors import ConfigError


def require_causal_lm(model_type: str, key: str) -> None:
    """bigtrain trains next-token predictors: refuse encoders and seq2seq models before anything is built."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(
            f"{key}: model_type {model_type!r} is not a causal language model; bigtrain trains causal LMs"
        )


def one_block(hf_config: Any) -> Any:
    """A copy of ``hf_config`` with a single decoder block: builds in milliseconds whatever the depth."""
    import copy

    probe = copy.deepcopy(hf_config)
    probe.num_hidden_layers = 1  # an alias (attribute_map) for the families that name it otherwise (GPT-2: n_layer)
    if isinstance(getattr(probe, "layer_types", None), list):
        probe.layer_types = probe.layer_types[:1]
    return probe


def require_causal_attention(hf_config: Any, key: str) -> None:
    """Refuse a model whose self-attention looks both ways.

    transformers registers some encoders as causal LMs (BERT's ``BertLMHeadModel``, RoBERTa's, ...): they build and
    train, but unless configured as decoders (``is_decoder``) every position attends to the tokens it is asked to
    predict. Their attention modules say so (``is_causal``): one block is built on the meta device and read.
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    probe = one_block(hf_config)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # BERT's "add is_decoder=True" warning: the error below says it better
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(probe)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{key}: the {hf_config.model_type} causal LM does not build ({e})") from e
    finally:
        hf_logging.set_verbosity(verbosity)
    flags = [
        bool(m.is_causal)
        for m in model.modules()
        if hasattr(m, "is_causal") and not getattr(m, "is_cross_attention", False)
    ]
    if flags and not all(flags):
        raise ConfigError(
            f"{key}: model_type {hf_config.model_type!r} is an encoder whose attention sees the whole sequence "
            "(is_causal=False), so every position would see the token it predicts; bigtrain trains causal LMs "
            "(a decoder-only model such as llama, qwen2, mistral or gpt2, or this one with is_decoder=true)"
        )


def hf_config_from_dict(spec: dict[str, Any], key: str = "model.config") -> Any:
    """A ``PretrainedConfig`` from a dict that names its ``model_type``; transformers fills every field left out.

    ``key`` names where the dict came from, for the error message.
    """
    from transformers import AutoConfig

    fields = dict(spec)
    model_type = fields.pop("model_type", None)
    if model_type is None:
        raise ConfigError(f"{key} needs model_type (e.g. llama, qwen2, mistral, gpt2)")
    require_causal_lm(model_type, key)
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{key}: the {model_type} config does not load ({e})") from e
    require_causal_attention(config, key)
    return config


# The tensor-parallel styles bigtrain maps to torch's (parallel/tensor_parallel.py). Layouts using others (Qwen3's
# per-head norms need "replicated_with_grad_allreduce") are refused rather than run wrong.
TP_STYLES = ("colwise", "rowwise")


def tp_layout(hf_config: Any) -> dict[str, str]:
    """The model's own tensor-parallel layout (``base_model_tp_plan``: module pattern -> style), or a ConfigError
    naming why it cannot be split."""
    layout = getattr(hf_config, "base_model_tp_plan", None) or {}
    others = sorted({style for style in layout.values() if style not in TP_STYLES})
    if not layout or others:
        why = f"uses the style(s) {', '.join(others)}" if others else "ships no tensor-parallel layout"
        raise ConfigError(
            f"parallel.tp > 1: model_type {hf_config.model_type!r} {why} in transformers' base_model_tp_plan; "
            "tensor parallelism supports llama, mistral, qwen2 and their relatives: use parallel.tp=1"
        )
    return dict(layout)


def check_tensor_parallel(hf_config: Any, tp: int, loss_parallel: bool = False) -> None:
    """tp must split the model's layout and both head counts evenly (checked on every rank before any group); a
    vocabulary-parallel head must be untied and split the vocabulary evenly."""
    if tp == 1:
        return
    tp_layout(hf_config)
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    for key, n in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
        if n % tp:
            fits_both = divisor_hint(math.gcd(heads, kv_heads))  # what divides both head counts divides their gcd
            raise ConfigError(f"parallel.tp={tp} does not divide {key}={n}; try {fits_both}")
    if loss_parallel:
        if getattr(hf_config, "tie_word_embeddings", False):
            raise ConfigError(
                "parallel.loss_parallel=true shards the LM head over the vocabulary, but this model ties it to the "
                "input embeddings (tie_word_embeddings=true), which stay whole; set parallel.loss_parallel=false"
            )
        vocab = hf_config.vocab_size
        if vocab % tp:
            raise ConfigError(
                f"parallel.loss_parallel=true: parallel.tp={tp} does not divide vocab_size={vocab}; "
                f"use a tp in {divisor_hint(math.gcd(vocab, 1 << 20))} or pad the vocabulary to a multiple of {tp}"
            )
