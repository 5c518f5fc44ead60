"""A toy task, as a new engineer would add one (tests/integration/test_a_task_is_one_file.py copies this file into a
copy of the package as ``bigtrain/tasks/regression.py`` and adds its one line to ``RECORDS``): a regression head,
one number per text, on ``AutoModelForSequenceClassification`` with one output (transformers' ``problem_type:
regression``).

It brings its recognition, its data reader (``.jsonl`` records of a text and a target, read with the built-in byte
tokenizer), what the data adds to the model's config, a synthetic micro-batch for the simulator, its planner
statistics (a classifier's, measured on fake tensors), what export writes beside the weights, its default objective
(the toy objective ``mse``) and its rows; nothing else of bigtrain is edited to add it."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

from bigtrain.config.setup import EXAMPLES
from bigtrain.tasks import classifiers
from bigtrain.tasks.spec import Prepared, TaskSpec

NAME = "regression"


@dataclasses.dataclass
class Targets:
    """Texts as byte ids, cut at ``seq_len``, each with its target (the dataset protocol the loaders read)."""

    ids: list[list[int]]
    targets: list[float]
    seq_len: int
    description: str
    index: Any = None
    truncated: int = 0
    positions: Any = None

    @property
    def num_rows(self) -> int:
        return len(self.targets) if self.index is None else len(self.index)

    @property
    def examples(self) -> int:
        return self.num_rows

    def at(self, rows: Any) -> list[int]:
        return [int(r) if self.index is None else int(self.index[r]) for r in rows]

    def subset(self, index: Any, description: str, augment: bool = False) -> Targets:
        return dataclasses.replace(self, index=self.at(index), description=description)

    def micro_batch(self, rows: Any, seen: Any = None) -> Any:
        import torch

        from bigtrain.data.batch import ExampleBatch

        at = self.at(rows)
        longest = max(len(self.ids[i]) for i in at)
        ids = torch.full((len(at), longest), 256, dtype=torch.int64)
        mask = torch.zeros((len(at), longest), dtype=torch.int64)
        for k, i in enumerate(at):
            ids[k, : len(self.ids[i])] = torch.tensor(self.ids[i])
            mask[k, : len(self.ids[i])] = 1
        return ExampleBatch({"input_ids": ids, "attention_mask": mask}, torch.tensor([self.targets[i] for i in at]))


def read_targets(cfg: Any, hf_config: Any) -> tuple[Any, Any]:
    """``data.path`` (a ``.jsonl`` of ``{"text": ..., "target": number}``), and the held-out records."""
    from bigtrain.data.held_out import with_held_out

    def read(key: str, path: str) -> Targets:
        records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        ids = [list(r["text"].encode("utf-8"))[: cfg.data.seq_len] for r in records]
        return Targets(ids, [float(r["target"]) for r in records], cfg.data.seq_len, f"{len(ids)} texts of {path}")

    return with_held_out(cfg, read("data.path", cfg.data.path), read, "texts")


def prepare(cfg: Any, hf_config: Any, data: Any) -> Prepared:
    """One output, read as a number (transformers' regression head), in a copy of the config."""
    hf_config = copy.deepcopy(hf_config)
    hf_config.num_labels, hf_config.problem_type, hf_config.pad_token_id = 1, "regression", 256
    return Prepared(cfg, hf_config)


def synthetic(hf_config: Any, plan: Any, workload: Any, device: Any) -> Any:
    import torch

    from bigtrain.data.batch import ExampleBatch

    b = plan.micro_batch_size
    ids = torch.randint(0, hf_config.vocab_size, (b, workload.seq_len), device=device)
    return ExampleBatch({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, torch.randn(b, device=device))


def files(cfg: Any, hf_config: Any, data: Any) -> Any:
    from bigtrain.checkpoint.export import HfFiles

    return HfFiles(byte_tokenizer=True)


TASK = TaskSpec(
    name=NAME,
    summary="toy regression head: one number per text",
    auto_class="AutoModelForSequenceClassification",
    mapping="MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    suffix="ForSequenceClassification",
    named=lambda hf_config: getattr(hf_config, "problem_type", None) == "regression",
    auto=False,  # only when model.task names it
    unit="examples",
    outputs=EXAMPLES,
    default_objective="mse",
    built_objectives=("mse",),
    read_data=read_targets,
    prepare=prepare,
    planner=classifiers.planner,
    sizes=lambda ask: classifiers.sizes(ask, images=False),
    synthetic=synthetic,
    count=classifiers.count_examples,
    export_files=files,
    peft_task_type="SEQ_CLS",
    metrics=("eval_rmse",),
    rules=classifiers.RULES,
    example={"model_type": "bert", "vocab_size": 257, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4},  # fmt: skip
)
