"""``model.task: embedding``: a text embedding model (sentence-transformers' bi-encoders: BERT/ModernBERT encoders
with mean or CLS pooling, decoders with last-token pooling) trained on records of an anchor, its positive and optional
hard negatives with in-batch negatives over the whole global batch (``train.objective: contrastive``). The trained
model is transformers' base model of the family (``AutoModel``: its token states, no head); the pooling is the
objective's (``train.pooling``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bigtrain.config.schema import RecipeConfig
from bigtrain.config.setup import EMBEDDINGS
from bigtrain.tasks import classifiers
from bigtrain.tasks.spec import Prepared, TaskSpec
from bigtrain.tasks.token_rows import text_files


def read_data(cfg: RecipeConfig, hf_config: Any) -> tuple[Any, Any]:
    """The examples of ``data.path`` and the held-out ones (``data.eval_path``, else ``data.eval_fraction`` of them),
    tokenised by data.tokenizer, else the model folder's tokenizer, else bytes."""
    from bigtrain.data.held_out import with_held_out
    from bigtrain.data.text_classes import tokenizer_folder
    from bigtrain.data.text_pairs import load_text_pairs

    tokenizer = tokenizer_folder(cfg.data, cfg.model.name_or_path)

    def read(key: str, path: str) -> Any:
        return load_text_pairs(cfg.data, key, path, tokenizer)

    return with_held_out(cfg, read("data.path", cfg.data.path), read, "examples")


def prepare(cfg: RecipeConfig, hf_config: Any, data: Any) -> Prepared:
    """``train.pooling: auto`` made the model folder's (a sentence-transformers folder's pooling) or the family's
    (last_token for decoders, else mean), recorded in the recipe; the id texts are padded with in a copy of the
    model's config."""
    import copy

    hf_config = copy.deepcopy(hf_config)
    hf_config.pad_token_id = data.pad_id
    if cfg.train.pooling == "auto":
        from pathlib import Path

        from bigtrain.checkpoint.sentence_transformer import folder_pooling
        from bigtrain.losses.contrastive import family_pooling

        # a sentence-transformers folder's own pooling (BGE's CLS), else the family's
        folder = Path(cfg.model.name_or_path) if cfg.model.name_or_path else None
        pooling = (folder_pooling(folder) if folder else None) or family_pooling(hf_config)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, pooling=pooling))
    if _has_pooler(hf_config) and "pooler" not in cfg.model.freeze:
        # BERT's pooler (a dense layer on the first token, for next-sentence prediction) is no embedding of ours:
        # frozen, it keeps its values and no rank waits for its gradient
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, freeze=[*cfg.model.freeze, "pooler"]))
    return Prepared(cfg, hf_config)


def _has_pooler(hf_config: Any) -> bool:
    import torch
    from transformers import AutoModel

    with torch.device("meta"):
        model = AutoModel.from_config(hf_config)
    return getattr(model, "pooler", None) is not None


def planner(model_config: dict[str, Any], workload: Any) -> Any:
    """The terms of the family's one-output sequence classifier (its base model and a head of one output, which
    weighs nothing beside it) with the gradient cache's second forward and cached gradients
    (``planner/embedding_plan.py``)."""
    from transformers.models.auto import modeling_auto

    from bigtrain.planner.embedding_plan import embedding_model

    name = modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES[model_config["model_type"]]
    model_config = {**model_config, "architectures": [name], "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}
    if model_config.get("pad_token_id") is None:  # the head's batch of rows finds each row's end by it
        model_config["pad_token_id"] = 0
    return embedding_model(model_config, workload)


def export_files(cfg: RecipeConfig, hf_config: Any, data: Any) -> Any:
    """The tokenizer the texts were read with, and the files that make the folder a sentence-transformers model."""
    files = text_files(cfg, hf_config, data)
    return dataclasses.replace(files, sentence_transformer=(cfg.train.pooling, hf_config.hidden_size, cfg.data.seq_len))


TASK = TaskSpec(
    name="embedding",
    summary="text embedding models (bi-encoders): anchor, positive[, negatives] records, in-batch negatives",
    auto_class="AutoModel",
    mapping="MODEL_MAPPING_NAMES",
    suffix=None,
    auto=False,  # a base model's folder may be anything's backbone: the task is named, never guessed
    named=lambda hf_config: False,
    unit="pairs",
    outputs=EMBEDDINGS,
    default_objective="contrastive",
    built_objectives=("contrastive",),
    read_data=read_data,
    prepare=prepare,
    model_facts=classifiers.layer_facts,
    planner=planner,
    sizes=lambda ask: classifiers.sizes(ask, images=False),
    synthetic=lambda *args: None,  # the objective's
    count=lambda *args: 0.0,
    export_files=export_files,
    peft_task_type="FEATURE_EXTRACTION",
    metrics=("eval_accuracy", "eval_mrr_at_10"),  # recall@10 too in metrics.jsonl; the bar stays one line
    keys=("data.path", "data.eval_path", "data.eval_fraction", "data.tokenizer", "data.seq_len"),
    rules=classifiers.RULES,
    example={
        "model_type": "bert",
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    },  # fmt: skip
)
