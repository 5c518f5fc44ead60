"""HuggingFace configs from plain dicts: the one place a ``{"model_type": ..., ...}`` mapping becomes a transformers
config (recipes' ``model.config``, planner presets, config.json files, the simulator, the tests' tiny models)."""

from __future__ import annotations

from typing import Any

from bigtrain.errors import ConfigError


def require_causal_lm(model_type: str, key: str) -> None:
    """The planner, the simulator and the Python API's plans model next-token predictors: refuse other models (and
    encoders and seq2seq models) before anything is built. ``bigtrain train`` reads the task first
    (``bigtrain/tasks``) and trains classifiers on written plans."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(
            f"{key}: model_type {model_type!r} is not a causal language model; for another task name it with "
            "model.task (image-classification, sequence-classification, image-text-to-text) or in the config's "
            "architectures"
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
            "(is_causal=False), so as a causal LM every position would see the token it predicts: use a decoder-only "
            "model (llama, qwen2, mistral, gpt2), or train it as a classifier with model.task=sequence-classification"
        )


def config_object(spec: dict[str, Any], key: str = "model.config", causal_lm: bool = True) -> Any:
    """The ``PretrainedConfig`` of a dict that names its ``model_type`` (transformers fills every field left out),
    without the checks of ``hf_config_from_dict``: for a dict that already passed them (the planner's).
    ``causal_lm=False``: any family (the recipe's model.task decides what it is built as)."""
    from transformers import AutoConfig

    from bigtrain.config.diffusers_types import is_diffusers_config

    if is_diffusers_config(spec):  # a diffusion transformer (model.task: text-to-image): diffusers' config, not ours
        from bigtrain.config.diffusers_config import from_dict

        return from_dict(spec, key)
    fields = dict(spec)
    model_type = fields.pop("model_type", None)
    if model_type is None:
        raise ConfigError(f"{key} needs model_type (e.g. llama, qwen2, mistral, gpt2)")
    if causal_lm:
        require_causal_lm(model_type, key)
    try:
        return AutoConfig.for_model(model_type, **fields)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{key}: the {model_type} config does not load ({e})") from e


def hf_config_from_dict(spec: dict[str, Any], key: str = "model.config") -> Any:
    """A ``PretrainedConfig`` from a dict that names its ``model_type``; transformers fills every field left out.
    Encoders and other models that are not causal LMs are refused. ``key`` names where the dict came from."""
    config = config_object(spec, key)
    if may_see_both_ways(config):
        require_causal_attention(config, key)
    return config


def may_see_both_ways(hf_config: Any) -> bool:
    """Whether a causal-LM family could be an encoder underneath (and so needs ``require_causal_attention``'s probe,
    which imports transformers' modelling code: seconds a plan should not spend on a Llama): the families transformers
    also lists as masked or sequence-to-sequence LMs, and any whose config carries ``is_decoder`` (BERT-generation,
    GPT-NeoX). Decoder-only families have none of these."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    model_type = hf_config.model_type
    both_ways = (
        model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES or model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
    )
    return both_ways or hasattr(hf_config, "is_decoder")


# transformers' tensor-parallel styles that bigtrain maps onto torch's DTensor styles (parallel/transforms/
# tensor_parallel.py): the plain Megatron pair, its variants that gather a column-wise output or take a replicated
# row-wise input (Phi-3, OLMo-2), per-head norms replicated with summed gradients (Qwen3's q_norm and k_norm), and
# vocabulary-parallel input embeddings (GPT-NeoX's embed_in from transformers 5.24). A layout with any other style is
# refused by the capability table with the style's name; tests/unit/test_tp_styles.py reads every family's layout in
# the installed transformers, so a release that brings a new style fails one test instead of a training run.
TP_STYLES = (
    "colwise",
    "rowwise",
    "colwise_rep",
    "colwise_gather_output",
    "rowwise_rep",
    "rowwise_split_input",
    "replicated_with_grad_allreduce",
    "embedding_rowwise",
)
# Styles of the installed transformers that bigtrain knows and refuses, each with why (the capability table's line
# names the style and this reason). A style in neither tuple is refused too, as unknown, and fails the unit test.
REFUSED_TP_STYLES = {
    "packed_colwise": "fused gate/up (or q/k/v) weights split per packed part: not mapped yet",
    "packed_rowwise": "fused expert weights split per packed part: not mapped yet",
    "moe_tp_experts": "experts split by tensor parallelism: bigtrain splits experts with parallel.ep instead",
    "moe_identity_expert": "identity experts under tensor parallelism: not mapped yet",
    "mla_kv_a_proj": "multi-head latent attention's shared KV projection: not mapped yet",
    "local_params": "parameters kept local to each rank outside DTensor: not mapped yet",
    "embedding_colwise": "embeddings split on the hidden dimension: not mapped yet",
    "all_reduce": "a module whose output transformers all-reduces by hand: not mapped yet",
    "replicate": "modules replicated by transformers' own hooks: not mapped yet",
}
PLAIN_TP_STYLES = ("colwise", "rowwise")  # what sequence parallelism and the planner's tp terms assume


def tp_layout(hf_config: Any) -> dict[str, str]:
    """The model's own tensor-parallel layout (``base_model_tp_plan``: module pattern -> style); the capability
    table has checked that it exists and uses only ``TP_STYLES``."""
    return dict(getattr(hf_config, "base_model_tp_plan", None) or {})


AUTO_ATTENTION = "auto"


def model_class(hf_config: Any) -> Any:
    """The transformers class the config names (``architectures``: the class of the task it was resolved for, as a
    saved folder names its own), or None: a config naming none (the planner's presets) is a causal LM."""
    import transformers

    for name in getattr(hf_config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls
    return None


def causal_lm_class(hf_config: Any) -> Any:
    """The family's causal LM class (what a config naming no class builds as), or None."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(hf_config.model_type)
    if isinstance(name, (list, tuple)):
        name = name[0]
    return getattr(transformers, name, None) if isinstance(name, str) else None


def attention_choices(hf_config: Any) -> list[str]:
    """The attention implementations transformers builds this family with, its own default first: sdpa where the
    family's class supports it, else eager; flash_attention_2 where supported and installed; flex where supported."""
    from transformers.utils import is_flash_attn_2_available

    cls = model_class(hf_config) or causal_lm_class(hf_config)
    supports = {flag: getattr(cls, flag, False) for flag in ("_supports_sdpa", "_supports_flash_attn")}
    choices = ["sdpa"] if supports["_supports_sdpa"] else []
    choices.append("eager")
    if supports["_supports_flash_attn"] and is_flash_attn_2_available():
        choices.append("flash_attention_2")
    if getattr(cls, "_supports_flex_attn", False):
        choices.append("flex_attention")
    return choices


def resolve_attention(hf_config: Any, asked: str) -> str:
    """``model.attn_implementation``: ``auto`` is the family's own default (``attention_choices``); anything else as
    asked (``build_meta_model`` says what would work when it cannot build)."""
    return attention_choices(hf_config)[0] if asked == AUTO_ATTENTION else asked


def decoder_blocks(model: Any) -> list[tuple[Any, str, Any]]:
    """The repeated blocks as (parent, attribute name, block), found through HF's ``_no_split_modules``.

    HF lists, for every architecture, the block classes that must not be split across devices: exactly the units we
    shard (FSDP) and recompute (activation checkpointing) one at a time. A block nested in another listed block
    (ConvNeXt lists its layers and the stages holding them) belongs to the outer one. A model that lists none (BERT's
    classifiers) has its units found by shape instead: the items of its longest list of modules of one class (the
    encoder's layers).
    """
    names = set(getattr(model, "_no_split_modules", None) or [])
    found = []
    inside: set[int] = set()
    for _, parent in model.named_modules():
        if id(parent) in inside:
            continue
        for attr, child in parent.named_children():
            if type(child).__name__ in names and id(child) not in inside:
                found.append((parent, attr, child))
                inside.update(id(m) for m in child.modules())
    if not found:
        found = _repeated_blocks(model)
    if not found:
        raise ConfigError(f"cannot find the decoder blocks of {type(model).__name__} (no _no_split_modules match)")
    return found


def _repeated_blocks(model: Any) -> list[tuple[Any, str, Any]]:
    """The items of the model's longest ``nn.ModuleList`` whose items are all of one class (at least two)."""
    from torch import nn

    lists = [
        m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 1 and len({type(c) for c in m}) == 1
    ]
    if not lists:
        return []
    longest = max(lists, key=len)
    return [(longest, str(i), child) for i, child in enumerate(longest)]


def is_linear(module: Any) -> bool:
    """A module peft can adapt as a linear: nn.Linear, or GPT-2's Conv1D (a linear with its weight transposed)."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, (nn.Linear, Conv1D))


def linear_names(model: Any) -> tuple[list[str], list[str]]:
    """The last name part of every linear inside the repeated blocks, and of every other linear (the LM head). A
    diffusers transformer's inside names are its attention projections (``diffusers_types.LORA_TARGETS``): its blocks'
    feed-forward linears are named by their index (``ff.net.2``), which peft's endings would match whole blocks by."""
    from bigtrain.config.diffusers_types import LORA_TARGETS

    if type(model).__module__.startswith("diffusers."):
        every = {name for name, m in model.named_modules() if is_linear(m)}
        inside_named = sorted(t for t in LORA_TARGETS if any(names_module(t, n) for n in every))
        return inside_named, sorted(
            {n.rsplit(".", 1)[-1] for n in every} - {t.rsplit(".", 1)[-1] for t in LORA_TARGETS}
        )
    inside: set[str] = set()
    for _, _, block in decoder_blocks(model):
        inside |= {name.rsplit(".", 1)[-1] for name, m in block.named_modules() if is_linear(m)}
    every = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if is_linear(m)}
    return sorted(inside), sorted(every - inside)


def names_module(target: str, module_name: str) -> bool:
    """peft's rule for one name of ``target_modules``: the module's name ends with it (as a dotted suffix)."""
    return module_name == target or module_name.endswith("." + target)


def classifier_heads(model: Any, num_labels: int) -> list[str]:
    """The names of a classifier's linear layers that answer one output per label (outside the repeated blocks)."""
    from torch import nn

    in_blocks = {id(m) for _, _, block in decoder_blocks(model) for m in block.modules()}
    heads = [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and m.out_features == num_labels and id(m) not in in_blocks
    ]
    if not heads:
        raise ConfigError(
            f"train.method=lora: no linear layer of {type(model).__name__} answers its {num_labels} labels; name "
            "the head in lora.modules_to_save"
        )
    return heads


def model_config_object(model_config: dict[str, Any], key: str = "the model config") -> Any:
    """The ``PretrainedConfig`` of a planner or simulator model dict: as it is when it names its class
    (``architectures``: a classifier or a vision-language model, as presets, saved model folders and recipes resolved
    by ``bigtrain train`` name theirs) or holds a vision tower; otherwise a causal LM, with the causal-LM checks
    (``hf_config_from_dict``)."""
    from bigtrain.config.diffusers_types import is_diffusers_config

    if model_config.get("architectures") or "vision_config" in model_config or is_diffusers_config(model_config):
        return config_object(model_config, key, causal_lm=False)
    return hf_config_from_dict(model_config, key)
