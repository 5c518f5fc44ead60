"""``model.task: causal-lm``: a decoder trained to predict the next token of token rows (pre-training, text, chat and
instruction fine-tuning; the preference objectives read its log-probabilities of two answers)."""

from __future__ import annotations

from typing import Any

from bigtrain.config.schema import RecipeConfig
from bigtrain.errors import ConfigError
from bigtrain.tasks import token_rows
from bigtrain.tasks.spec import TOKEN_ROWS, TaskSpec


def _claims(hf_config: Any) -> bool:
    """A decoder family (an encoder such as BERT is also listed as a causal LM, but is no decoder)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return hf_config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def accepts(hf_config: Any, model_cfg: Any) -> None:
    """A family with a causal LM class, whose attention does not see both ways (a folder's model is checked as
    saved; a config built here where its family can be bidirectional)."""
    from bigtrain.config.hf import may_see_both_ways, require_causal_attention, require_causal_lm
    from bigtrain.models.build import config_key

    key = config_key(model_cfg)
    require_causal_lm(hf_config.model_type, key)
    if model_cfg.name_or_path is not None or may_see_both_ways(hf_config):
        require_causal_attention(hf_config, key)


def read_rows(cfg: RecipeConfig, hf_config: Any) -> tuple[Any, Any]:
    """Token rows of ``data.path`` (tokenised and packed by its format, or a tokenised ``.npy``) and the held-out
    rows, of the training rows' length."""
    from bigtrain.data.cache import cache_dir_of
    from bigtrain.data.held_out import require_held_out
    from bigtrain.data.sources import check_vocabulary, hold_out, load_token_rows, load_training_rows, parts_of

    data_cfg, vocab = cfg.data, hf_config.vocab_size
    data = load_training_rows(data_cfg, cfg.train.seed)
    for part, path, key in parts_of(data, data_cfg):
        check_vocabulary(part, vocab, path, key, cache_dir_of(data_cfg))
    held = None
    if data_cfg.eval_path is not None:
        held = load_token_rows(data_cfg, "data.eval_path", data_cfg.eval_path)
        check_vocabulary(held, vocab, data_cfg.eval_path, "data.eval_path", cache_dir_of(data_cfg))
        if held.seq_len != data.seq_len:
            raise ConfigError(
                f"data.eval_path={data_cfg.eval_path!r} has rows of {held.seq_len} tokens but data.path of "
                f"{data.seq_len}; evaluate on rows of the training length"
            )
    elif data_cfg.eval_fraction > 0:
        data, held = hold_out(data, data_cfg.eval_fraction, cfg.train.seed)
    require_held_out(cfg, held)
    return data, held


def check(cfg: RecipeConfig, hf_config: Any, data: Any, attention: str, is_main: bool) -> list[str]:
    return token_rows.check_rows(cfg, hf_config, data, attention, is_main, TASK.name)


def planner(model_config: dict[str, Any], workload: Any) -> Any:
    from bigtrain.planner.planned import lm_model

    return lm_model(model_config)


TASK = TaskSpec(
    name="causal-lm",
    summary="next-token prediction on token rows (pre-training, text, chat and instruction fine-tuning)",
    auto_class="AutoModelForCausalLM",
    mapping="MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    suffix="ForCausalLM",
    unit="tokens",
    outputs=TOKEN_ROWS,
    default_objective="sft",
    auto=True,
    claims=_claims,
    accepts=accepts,
    read_data=read_rows,
    check=check,
    planner=planner,
    sizes=token_rows.sizes,
    synthetic=token_rows.synthetic_rows,
    count=token_rows.labelled_tokens,
    export_files=token_rows.text_files,
    peft_task_type="CAUSAL_LM",
    metrics=("eval_perplexity",),
    keys=("data.path", "data.seq_len", "data.format", "data.packing", "data.tokenizer"),
    example={"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
             "tie_word_embeddings": False},  # fmt: skip
)
