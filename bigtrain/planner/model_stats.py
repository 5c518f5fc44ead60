"""What the planner needs to know about a model: its shapes, parameter counts, activations and FLOPs.

``ModelStats.from_config`` reads a HF config dict (defaults already filled in, see ``load_model_config``). The
families with formulas (``FORMULA_FAMILIES``: decoder-only transformers with RoPE, RMSNorm and a gated (SwiGLU) MLP:
llama, mistral, qwen2, qwen3; and GPT-2: learned positions, LayerNorm with bias, GELU MLP, biases everywhere) are
described by their config fields alone, in pure Python; counts are exact (``tests/unit/test_planner.py`` checks them
against the numel of meta-built HF models). Every other causal LM transformers ships, dense or a mixture of experts,
is measured on the model itself (``block_probe.py``: its parameters on the meta device, one block of each kind on
fake tensors), once per config; the formulas give the same numbers as the measurement (tested), which is why they
stay where they exist.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from bigtrain.config.capabilities import ModelFacts
from bigtrain.config.hf import config_object, model_config_object, resolve_attention
from bigtrain.errors import ConfigError
from bigtrain.planner.block_probe import ModelProfile, profile_model
from bigtrain.planner.known_configs import recorded_config, recorded_facts
from bigtrain.planner.vision_stats import VisionStats, vision_stats

ROPE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
# vision-language models whose decoder is a causal-LM family's, under a text model type of its own
TEXT_FAMILIES = {"qwen2_vl_text": "qwen2", "qwen2_5_vl_text": "qwen2", "qwen3_vl_text": "qwen3"}
FORMULA_FAMILIES = (*ROPE_FAMILIES, "gpt2")


@dataclass(frozen=True)
class ModelStats:
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # MLP inner width
    vocab: int
    tied: bool  # LM head shares the embedding matrix
    gated_mlp: bool  # SwiGLU: gate, up and down projections
    qkv_bias: bool
    linear_bias: bool  # o_proj and MLP projections carry biases (GPT-2)
    norm_bias: bool  # LayerNorm (weight + bias) rather than RMSNorm (weight)
    positions: int  # rows of a learned position embedding (GPT-2), 0 with RoPE
    facts: ModelFacts  # what the capability table reads (heads, layers, tying, the layouts transformers ships)
    qk_norm: bool = False  # RMSNorm over each head of q and k (Qwen3)
    profile: ModelProfile | None = None  # measured (families without formulas): replaces the counts below
    num_experts: int = 0  # routed experts per MoE block (0: dense)
    top_k: int = 0  # experts each token is routed to
    logit_softcap: bool = False  # the head's logits pass through cap·tanh(x/cap) (Gemma 2): tanh's output is saved
    # a vision-language model's vision tower and projector (the fields above are its language model's)
    vision: VisionStats | None = None

    # ---- parameter counts (cached: the search asks for them once per candidate, tens of thousands of times) -----
    @cached_property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @cached_property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @cached_property
    def attn_params(self) -> int:
        if self.profile:
            return round(self.profile.block.attn)
        h = self.hidden
        n = h * self.q_width + 2 * h * self.kv_width + self.q_width * h
        if self.qkv_bias:
            n += self.q_width + 2 * self.kv_width
        if self.linear_bias:
            n += h
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    @cached_property
    def mlp_params(self) -> int:
        if self.profile:
            return round(self.profile.block.mlp)
        h, f = self.hidden, self.ffn
        n = (3 if self.gated_mlp else 2) * h * f
        if self.linear_bias:
            n += (2 if self.gated_mlp else 1) * f + h
        return n

    @cached_property
    def norm_params(self) -> int:
        """One norm; measured families: what lies outside the blocks besides the embedding and head (the final
        norm)."""
        if self.profile:
            return self.profile.final_norm
        return self.hidden * (2 if self.norm_bias else 1)

    @cached_property
    def block_params(self) -> int:
        """One decoder block: attention, MLP (every expert of a mixture) and its norms; measured families: the mean
        over the model's blocks."""
        if self.profile:
            return round(self.profile.block.params)
        return self.attn_params + self.mlp_params + 2 * self.norm_params

    @cached_property
    def expert_params(self) -> int:
        """The routed experts' weights in one block (mean over the blocks; 0 for a dense model)."""
        return round(self.profile.block.experts) if self.profile else 0

    @cached_property
    def routed_layers(self) -> int:
        """Blocks with routed experts (DeepSeek-V3's first blocks are dense)."""
        return round(self.profile.block.routed * self.layers) if self.profile else 0

    @cached_property
    def active_block_params(self) -> int:
        """What one token goes through in a block: all but the experts, and top_k/num_experts of them."""
        return round(self.profile.block.active) if self.profile else self.block_params

    @cached_property
    def embed_params(self) -> int:
        if self.profile:
            return self.profile.embed
        return (self.vocab + self.positions) * self.hidden

    @cached_property
    def head_params(self) -> int:
        if self.profile:
            return self.profile.head
        return 0 if self.tied else self.vocab * self.hidden

    @cached_property
    def root_params(self) -> int:
        """Everything outside the blocks: embeddings, final norm, LM head (FSDP's root unit)."""
        return self.embed_params + self.norm_params + self.head_params

    @cached_property
    def params(self) -> int:
        return self.layers * self.block_params + self.root_params + self.vision_params

    @cached_property
    def vision_params(self) -> int:
        """A vision-language model's vision tower and projector (0 for a language model)."""
        return self.vision.params if self.vision else 0

    @cached_property
    def active_params(self) -> int:
        """Parameters one token goes through (= params for a dense model): what MFU counts for a mixture."""
        return self.layers * self.active_block_params + self.root_params + self.vision_params

    # ---- compute per token ------------------------------------------------------------------------------------
    def attention_forward_flops(self, seq_len: int) -> float:
        """Forward FLOPs per token of one block's attention scores (QK^T and PV: 4·L·d, PaLM's count, causal
        masking not discounted)."""
        if self.profile:
            return self.profile.flops_per_len * seq_len
        return 4.0 * seq_len * self.q_width

    def block_forward_flops(self, seq_len: int) -> float:
        """Forward FLOPs per token of one block: 2 per parameter a token goes through (for a mixture: the router's
        top_k experts, not all of them) plus attention. The formulas count every parameter as a matmul's, the
        measurement only the matmuls' weights (not the norms' weights nor biases: 0.003% at Llama-3-8B width)."""
        if self.profile:
            return self.profile.flops + self.attention_forward_flops(seq_len)
        return 2.0 * self.block_params + self.attention_forward_flops(seq_len)

    # ---- construction -----------------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelStats:
        model_type = cfg.get("model_type")
        if "vision_config" in cfg and "text_config" in cfg:
            return cls.vision_language(cfg)
        if _names_classifier(cfg):
            raise ConfigError(
                f"{cfg.get('architectures')}: these statistics model causal LMs only; classifiers are measured by "
                "planner/classifier_stats.py (bigtrain plan chooses the planner by the model's task)"
            )
        facts = recorded_facts(cfg) if model_type in FORMULA_FAMILIES else None
        if facts is None:
            hf_config = config_object(cfg)
            facts = ModelFacts.of(hf_config)
            if model_type not in FORMULA_FAMILIES:
                return cls.measured(cfg, hf_config, facts)
        if model_type == "gpt2":
            hidden, heads = cfg["n_embd"], cfg["n_head"]
            return cls(
                model_type="gpt2",
                hidden=hidden,
                layers=cfg["n_layer"],
                heads=heads,
                kv_heads=heads,
                head_dim=hidden // heads,
                ffn=cfg.get("n_inner") or 4 * hidden,
                vocab=cfg["vocab_size"],
                tied=bool(cfg.get("tie_word_embeddings", True)),  # GPT-2 ties unless told otherwise
                gated_mlp=False,
                qkv_bias=True,
                linear_bias=True,
                norm_bias=True,
                positions=cfg["n_positions"],
                facts=facts,
            )
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        return cls(
            model_type=model_type,
            hidden=hidden,
            layers=cfg["num_hidden_layers"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            ffn=cfg["intermediate_size"],
            vocab=cfg["vocab_size"],
            tied=bool(cfg.get("tie_word_embeddings")),
            gated_mlp=True,
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias")),
            linear_bias=False,
            norm_bias=False,
            positions=0,
            qk_norm=model_type == "qwen3",
            facts=facts,
        )

    @classmethod
    def vision_language(cls, cfg: dict[str, Any]) -> ModelStats:
        """A vision-language model: its language model's statistics (from its text config, as a causal LM of the
        family its decoder is), its vision side (``vision_stats.py``), and the table's facts of the whole model."""
        from dataclasses import replace

        from bigtrain.config.hf import model_config_object

        hf_config = model_config_object(cfg)
        language = cls.from_config(language_model_dict(hf_config.get_text_config().to_dict()))
        return replace(
            language,
            model_type=cfg["model_type"],
            facts=ModelFacts.of(hf_config),
            vision=vision_stats(hf_config),
        )

    @classmethod
    def measured(cls, cfg: dict[str, Any], hf_config: Any, facts: ModelFacts) -> ModelStats:
        """A family without formulas: the shape fields the cost terms read (from the config, with the usual
        defaults), and the counts, activations and FLOPs measured on the model (``block_probe.py``)."""
        profile = profile_model(hf_config, resolve_attention(hf_config, "auto"))
        hidden = hf_config.hidden_size
        heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
        if profile.num_experts:
            ffn = profile.top_k * profile.expert_ffn  # the inner width one token goes through
        else:
            ffn = getattr(hf_config, "intermediate_size", None) or 4 * hidden
        return cls(
            model_type=cfg["model_type"],
            hidden=hidden,
            layers=hf_config.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            ffn=ffn,
            vocab=hf_config.vocab_size,
            tied=profile.head == 0,
            gated_mlp=True,
            qkv_bias=False,
            linear_bias=False,
            norm_bias=False,
            positions=0,
            facts=facts,
            profile=profile,
            logit_softcap=bool(getattr(hf_config, "final_logit_softcapping", None)),
            num_experts=profile.num_experts,
            top_k=profile.top_k,
        )

    def summary(self) -> dict[str, Any]:
        experts = {"experts": self.num_experts, "top_k": self.top_k, "active_params": self.active_params}
        vision = {"vision_params": self.vision_params} if self.vision else {}
        return {
            **(experts if self.num_experts else {}),
            **vision,
            "params": self.params,
            "model_type": self.model_type,
            "layers": self.layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "ffn": self.ffn,
            "vocab": self.vocab,
            "tied": self.tied,
        }


def language_model_dict(text: dict[str, Any]) -> dict[str, Any]:
    """A vision-language model's text config as the causal LM its decoder is (Qwen2.5-VL's: Qwen2's; the
    multimodal rotary sections dropped, which a causal LM's config does not take and the counts do not need)."""
    out = {k: v for k, v in text.items() if k != "architectures"}
    out["model_type"] = TEXT_FAMILIES.get(out.get("model_type", ""), out.get("model_type", ""))
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(out.get(key), dict) and "mrope_section" in out[key]:
            out[key] = {k: v for k, v in out[key].items() if k != "mrope_section"}
    return out


def _names_classifier(cfg: dict[str, Any]) -> bool:
    """Whether a model dict names an image or sequence classifier class (``architectures``)."""
    names = cfg.get("architectures") or []
    return any(a.endswith(("ForImageClassification", "ForSequenceClassification")) for a in names)


def _names_base_model(cfg: dict[str, Any]) -> bool:
    """Whether a model dict names a family's base model (``MistralModel``: an embedding model's, no LM head)."""
    return any(a.endswith("Model") for a in cfg.get("architectures") or [])


def lm_preset_names() -> list[str]:
    """The presets of causal LMs (the others are classifiers, planned by planner/classifier_plan.py, and embedding
    models' base models, planned with ``--objective contrastive``)."""
    return [k for k in preset_names() if not (_names_classifier(_presets()[k]) or _names_base_model(_presets()[k]))]


def preset_names() -> list[str]:
    return [k for k in _presets() if not k.startswith("_")]


def _presets() -> dict[str, Any]:
    return json.loads(resources.files("bigtrain.planner").joinpath("presets.json").read_text())


def load_model_config(spec: str | dict[str, Any], key: str = "--model", live: bool = False) -> dict[str, Any]:
    """A full HF config dict from a preset name, a model folder, a config.json path, or a recipe's config dict.

    transformers fills in the defaults a partial dict leaves out; a classifier keeps its task (``architectures``),
    anything else but a causal LM is refused. ``key``: how
    the caller's input is named in errors (a flag, or a Python argument such as ``model``). A preset's dict is the
    one recorded for the installed transformers (``known_configs.py``) unless ``live``.
    """
    shown = f"{key} {spec!r}" if key.startswith("--") else f"{key}={spec!r}"
    if isinstance(spec, dict):
        raw = dict(spec)
    else:
        presets = _presets()
        path = Path(spec)
        if spec in presets and not spec.startswith("_"):
            if not live and (recorded := recorded_config(spec)) is not None:
                return recorded
            raw = dict(presets[spec])
        elif path.is_dir() and (path / "config.json").is_file():
            raw = json.loads((path / "config.json").read_text())
        elif path.is_file():
            try:
                raw = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ConfigError(f"{shown} is not a JSON config ({e.msg})") from e
        else:
            raise ConfigError(
                f"{shown} is neither a preset nor a local model folder or config.json; "
                f"presets: {', '.join(preset_names())}"
            )
    full = model_config_object(raw, key="the model config").to_dict()  # a causal LM, or a classifier (its task)
    full["model_type"] = raw["model_type"]
    return full
