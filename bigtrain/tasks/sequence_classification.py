"""``model.task: sequence-classification``: encoders (BERT, ModernBERT) and decoders with a score head trained on
texts with one label each, through ``AutoModelForSequenceClassification``."""

from __future__ import annotations

from typing import Any

from bigtrain.config.schema import RecipeConfig
from bigtrain.errors import ConfigError
from bigtrain.tasks import classifiers
from bigtrain.tasks.spec import EXAMPLES, TaskSpec


def read_texts(cfg: RecipeConfig, hf_config: Any) -> tuple[Any, Any]:
    """Texts of ``data.path`` with one label each, tokenised by data.tokenizer, else the model folder's tokenizer,
    else bytes; the held-out ones."""
    from bigtrain.data.text_classes import load_text_examples, tokenizer_folder

    tokenizer = tokenizer_folder(cfg.data, cfg.model.name_or_path)

    def read(key: str, path: str) -> Any:
        return load_text_examples(cfg.data, key, path, tokenizer)

    data, held = classifiers.read_examples(cfg, hf_config, read)
    vocab = getattr(hf_config, "vocab_size", None)
    if vocab is not None and data.vocab_size > vocab:
        raise ConfigError(
            f"the tokenizer has {data.vocab_size} ids but the model's vocab_size is {vocab}; set "
            f"model.config.vocab_size >= {data.vocab_size} or use a matching data.tokenizer"
        )
    return data, held


def files(cfg: RecipeConfig, hf_config: Any, data: Any) -> Any:
    """The tokenizer the texts were read with (data.tokenizer, or the built-in byte tokenizer)."""
    from bigtrain.tasks.token_rows import text_files

    return text_files(cfg, hf_config, data)


TASK = TaskSpec(
    name="sequence-classification",
    summary="text classifiers (BERT-like encoders, decoders with a score head): texts with one label each",
    auto_class="AutoModelForSequenceClassification",
    mapping="MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    suffix="ForSequenceClassification",
    unit="examples",
    outputs=EXAMPLES,
    default_objective="classification",
    read_data=read_texts,
    prepare=classifiers.prepare,
    lora_modules=classifiers.head_modules,
    model_facts=classifiers.layer_facts,
    planner=classifiers.planner,
    sizes=lambda ask: classifiers.sizes(ask, images=False),
    synthetic=classifiers.synthetic_examples,
    count=classifiers.count_examples,
    export_files=files,
    peft_task_type="SEQ_CLS",
    metrics=("eval_accuracy", "eval_top5_accuracy", "eval_macro_f1"),
    keys=(*classifiers.KEYS, "data.text_field", "data.tokenizer"),
    rules=classifiers.RULES,
    example={"model_type": "bert", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4},  # fmt: skip
)
