"""HuggingFace configs from plain dicts: the one place a ``{"model_type": ..., ...}`` mapping becomes a transformers
config (recipes' ``model.config``, planner presets, config.json files, the simulator, the tests' tiny models)."""

from __future__ import annotations

from typing import Any

from bigtrain.errors import ConfigError


def require_causal_lm(model_type: str, key: str) -> None:
    """bigtrain trains next-token predictors: refuse encoders and seq2seq models before anything is built."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(
            f"{key}: model_type {model_type!r} is not a causal language model; bigtrain trains causal LMs"
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
        return AutoConfig.for_model(model_type, **fields)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{key}: the {model_type} config does not load ({e})") from e
