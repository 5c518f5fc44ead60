"""What the capability table needs to know about a model, read from its HF config (or the planner's statistics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PP_LAYOUT_PARTS = frozenset({"embed_tokens", "layers", "norm"})
# config keys under which transformers' causal LMs change the logits after the LM head
LOGIT_TRANSFORM_KEYS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
# config keys of the routed experts per MoE block (Mixtral, Qwen-MoE, DeepSeek)
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


@dataclass(frozen=True)
class ModelFacts:
    """What the rules need to know about a model, from its HF config (the trainer) or its statistics (the planner)."""

    model_type: str
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool  # the LM head shares the input embeddings
    tp_styles: tuple[str, ...]  # the styles of transformers' base_model_tp_plan (none: no layout)
    pp_layout: bool  # transformers' base_model_pp_plan names embed_tokens, layers and norm
    # the config key of what the model's forward does to the logits after the LM head (Gemma's soft-capping,
    # Cohere's and Granite's scaling), None if nothing: a chunked loss, which takes the head out of the forward,
    # would skip it
    logits_after_head: str | None = None
    # the config asks for the router's load-balancing loss (output_router_logits with router_aux_loss_coef > 0)
    router_loss: bool = False
    num_experts: int = 0  # routed experts per MoE block (0: dense)
    ep_layout: bool = False  # transformers' base_model_ep_plan dispatches the experts (ep_dispatch_experts)
    batch_norm: bool = False  # the model normalises with BatchNorm (its statistics depend on how a batch is split)
    convolutional: bool = False  # the model has 2-D convolutions (what parallel.channels_last lays out)
    block_linears: bool = True  # its repeated blocks hold linear layers (what LoRA adapts; a CNN's are convolutions)

    @classmethod
    def of(
        cls, hf_config: Any, batch_norm: bool = False, convolutional: bool = False, block_linears: bool = True
    ) -> ModelFacts:
        """The facts of a model's config; what only its built model shows (BatchNorm, convolutions, linears in its
        blocks) as its task's spec measures it (``TaskSpec.model_facts``)."""
        from bigtrain.config.model_parts import language_config

        # a classifier may have no attention, layers or vocabulary (a CNN): 0 where the config has none; a
        # vision-language model's are its language model's (what tp slices, what the loss reads)
        whole, hf_config = hf_config, language_config(hf_config)
        heads = getattr(hf_config, "num_attention_heads", 0) or 0
        tp_plan = getattr(hf_config, "base_model_tp_plan", None) or {}
        return cls(
            model_type=whole.model_type,
            layers=getattr(hf_config, "num_hidden_layers", 0) or len(getattr(hf_config, "depths", []) or []),
            heads=heads,
            kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            vocab=getattr(hf_config, "vocab_size", 0) or 0,
            tied=bool(getattr(hf_config, "tie_word_embeddings", False)),
            tp_styles=tuple(sorted(set(tp_plan.values()))),
            pp_layout=PP_LAYOUT_PARTS <= set(getattr(hf_config, "base_model_pp_plan", None) or {}),
            logits_after_head=next(
                (key for key in LOGIT_TRANSFORM_KEYS if getattr(hf_config, key, None) not in (None, 1, 1.0)), None
            ),
            router_loss=bool(getattr(hf_config, "output_router_logits", False))
            and bool(getattr(hf_config, "router_aux_loss_coef", 0.0)),
            num_experts=next((int(getattr(hf_config, k)) for k in EXPERT_COUNT_KEYS if getattr(hf_config, k, None)), 0),
            ep_layout="ep_dispatch_experts" in (getattr(hf_config, "base_model_ep_plan", None) or {}).values(),
            batch_norm=batch_norm,
            convolutional=convolutional,
            block_linears=block_linears,
        )
