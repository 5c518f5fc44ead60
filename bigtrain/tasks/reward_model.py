"""``model.task: reward-model``: a model that scores an answer to a prompt with one number, trained on preference
pairs so the chosen answer scores above the rejected one (``train.objective: reward``, Bradley-Terry). It is
transformers' sequence classifier with one output (``AutoModelForSequenceClassification``, ``num_labels: 1``), built
from a causal LM's or an encoder's folder or config (the head made afresh), trained on data-parallel plans as the
classifiers are, and exported as a folder that transformers, TRL's ``GRPOTrainer`` and bigtrain's own GRPO read as a
reward model.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

from bigtrain.config.schema import RecipeConfig
from bigtrain.config.setup import SCORES
from bigtrain.tasks import classifiers
from bigtrain.tasks.spec import Prepared, TaskSpec
from bigtrain.tasks.token_rows import text_files

LABEL = "LABEL_0"  # transformers' name of a one-output head's output (TRL's reward models carry it)


def read_pairs(cfg: RecipeConfig, hf_config: Any) -> tuple[Any, Any]:
    from bigtrain.data.reward_pairs import read_reward_pairs

    return read_reward_pairs(cfg, hf_config)


def prepare(cfg: RecipeConfig, hf_config: Any, data: Any) -> Prepared:
    """One output in a copy of the model's config, and the id the rows are padded with (the head scores the last
    token before it). A folder whose head is not one output (a causal LM's, a classifier's) gets a new head, said in
    a note; under LoRA the head trains fully beside the adapters."""
    hf_config = copy.deepcopy(hf_config)
    hf_config.id2label, hf_config.label2id = {0: LABEL}, {LABEL: 0}
    hf_config.pad_token_id = data.pad_id
    notes: tuple[str, ...] = ()
    new_head = False
    if cfg.model.name_or_path is not None:
        saved = json.loads((Path(cfg.model.name_or_path) / "config.json").read_text())
        classes = len(saved.get("id2label") or {})
        scorer = any(a.endswith("ForSequenceClassification") for a in saved.get("architectures") or [])
        new_head = not (scorer and classes == 1)
        if new_head:
            notes = ("the model has no one-output score head: a new one is made, initialised as transformers does",)
    if cfg.train.method == "lora" and cfg.lora.modules_to_save is None:
        cfg = dataclasses.replace(
            cfg, lora=dataclasses.replace(cfg.lora, modules_to_save=classifiers.head_modules(hf_config))
        )
    return Prepared(cfg, hf_config, notes, new_head)


def planner(model_config: dict[str, Any], workload: Any) -> Any:
    """A classifier's statistics and terms (which compute a pair as its two rows) of the one-output classifier
    start-up builds of a causal LM's folder or preset."""
    name = TASK.class_name(model_config["model_type"])
    model_config = {**model_config, "architectures": [name], "id2label": {"0": LABEL}, "label2id": {LABEL: 0}}
    if model_config.get("pad_token_id") is None:  # the head reads up to the pad id: any id plans the same
        model_config["pad_token_id"] = 0
    return classifiers.planner(model_config, workload)


TASK = TaskSpec(
    name="reward-model",
    summary="reward models: a one-output score head trained on preference pairs (Bradley-Terry)",
    auto_class="AutoModelForSequenceClassification",
    mapping="MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    suffix=None,
    auto=False,  # a folder of a one-output classifier may be a regressor: the task is named, never guessed
    named=lambda hf_config: False,
    unit="answers",  # scored per second (two per pair)
    outputs=SCORES,
    default_objective="reward",
    built_objectives=("reward",),
    read_data=read_pairs,
    prepare=prepare,
    lora_modules=classifiers.head_modules,
    model_facts=classifiers.layer_facts,
    planner=planner,
    sizes=lambda ask: classifiers.sizes(ask, images=False),
    synthetic=lambda *args: None,  # the objective's (its pairs)
    count=lambda *args: 0.0,
    export_files=text_files,  # the tokenizer the pairs were read with (data.tokenizer, or the built-in bytes)
    peft_task_type="SEQ_CLS",
    keys=("data.path", "data.eval_path", "data.eval_fraction", "data.tokenizer", "data.seq_len"),
    rules=classifiers.RULES,
    # pad_token_id: the head finds each row's last token by it (start-up sets the data's; a bare config has none)
    example={
        "model_type": "llama",
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "pad_token_id": 0,
    },  # fmt: skip
)
