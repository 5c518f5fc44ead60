"""What a task spec is: everything one ``model.task`` decides, in one value.

A task (causal-lm, image-classification, ...) is one module of ``bigtrain/tasks`` ending in ``TASK = TaskSpec(...)``
and its name on one line of ``RECORDS`` there. The trainer, the engines, the planner's search, the simulator, the API
and the command line read a task only through its spec (``Job.task``); below this layer nothing knows a task by its
name: what the table's rows and the planner need travels as values (``JobFacts``, the planner's model, the export's
files, the build's options).

Hooks take the job's values and return new ones; none changes what it is given. Each imports what it needs when it
runs (the data readers, the planner's measurements), so reading a spec costs nothing: ``bigtrain plan`` of a preset
imports neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bigtrain.config.setup import EXAMPLES, TOKEN_ROWS

__all__ = ["EXAMPLES", "TOKEN_ROWS", "PlanAsk", "Prepared", "TaskSpec"]


@dataclass(frozen=True)
class Prepared:
    """What a task makes of a run before anything is built, from its recipe, model config and data: the recipe as the
    run records it, the model config the build reads (a classifier's labels), and notes for the user."""

    cfg: Any
    hf_config: Any
    notes: tuple[str, ...] = ()
    new_head: bool = False  # the pretrained head does not fit the data (another number of classes): made afresh


@dataclass(frozen=True)
class TaskSpec:
    """One task (``model.task``).

    Recognition and the model:
    - ``auto_class``, ``mapping``, ``suffix``: the transformers Auto class the model is built with, the mapping of
      model types to its classes, and how those classes' names end (None: the mapping alone names them);
    - ``auto``: whether ``model.task: auto`` picks it for a config whose ``architectures`` names none of ours: True
      (first pick, where ``claims(hf_config)`` says so: a decoder family, a config with a vision tower), False (never:
      it must be named), None (when it is the one task left);
    - ``named``: whether a config's ``architectures`` names this task's class (default: its suffix or mapping);
    - ``accepts(hf_config, model_cfg)``: its own checks of the model's config (the recipe's ``model`` section),
      before anything is read (a causal LM's attention must be causal);
    What it trains on and what it gives:
    - ``unit``: what throughput counts (tokens, images, examples); ``outputs``: what the model's logits are over
      (``TOKEN_ROWS``, ``EXAMPLES``), which decides the objectives that apply; ``default_objective``: what
      ``train.objective: auto`` trains; ``built_objectives``: the objectives built for it (None: every one that
      reads its outputs);
    - ``read_data(cfg, hf_config) -> (data, held_out)``: the training and held-out data (an objective with data of
      its own, pairs, replaces it);
    - ``prepare(cfg, hf_config, data) -> Prepared``: what the data adds to the run (a classifier's labels);
    - ``check(cfg, hf_config, data, attention, is_main) -> notes``: its own bad-input checks, before any group;
    - ``model_facts(hf_config) -> dict``: facts of its model for the table's rows (BatchNorm, convolutions);
    - ``workload(workload, data, cfg) -> Workload``: what its data adds to what the planner weighs (images);
    - ``synthetic(hf_config, plan, workload, device) -> batch``: one micro-batch as its data path makes it, values
      aside (the simulator, ``bigtrain probe``), and ``count(batch, workload, plan) -> float`` what the global batch
      of such micro-batches counts (the loss's normaliser); ``real_inputs()``: a dispatch mode that keeps what its
      forward reads the values of real on fake tensors (a VLM's image-token counts and grids), None: nothing;
    - ``sizes(PlanAsk) -> dict``: what a step processes as the planner is asked it (``seq_len``,
      ``global_batch_size`` and, where it has images, ``image_size``, ``images_per_row``, ``frozen``: Workload fields,
      the task's defaults where nothing was given, checked against the model);
    - ``planner(model_config, workload) -> PlannedModel``: its statistics and memory/time terms for the search;
    - ``export_files(cfg, hf_config, data) -> HfFiles``: what export writes beside the weights (tokenizer, image
      processor, processor, labels: ``checkpoint/export.py``);
    - ``peft_task_type``: peft's task type of an adapter folder of it (None: peft has none);
      ``lora_modules(hf_config)``: the modules it trains fully beside LoRA's adapters unless ``lora.modules_to_save``
      says (a classifier's head);
    - ``metrics``: the evaluation metrics the progress bar and the last line show, in order;
    - ``keys``, ``rules``: the recipe keys it reads and its own rows of what runs together (asked with the capability
      table's, ``JobFacts.rules``);
    - ``example``: a tiny config of a model of it (``model.config``), which the generated docs ask the table about.
    """

    name: str
    summary: str
    auto_class: str
    mapping: str
    suffix: str | None
    unit: str
    outputs: str
    default_objective: str
    read_data: Callable[[Any, Any], tuple[Any, Any]]
    planner: Callable[[dict[str, Any], Any], Any]
    sizes: Callable[[Any], dict[str, Any]]
    synthetic: Callable[[Any, Any, Any, Any], Any]
    count: Callable[[Any, Any, Any], float]
    real_inputs: Callable[[], Any] | None = None
    auto: bool | None = None
    claims: Callable[[Any], bool] | None = None
    named: Callable[[Any], bool] | None = None
    accepts: Callable[[Any, Any], None] | None = None
    built_objectives: tuple[str, ...] | None = None
    prepare: Callable[[Any, Any, Any], Prepared] | None = None
    check: Callable[[Any, Any, Any, str, bool], list[str]] | None = None
    model_facts: Callable[[Any], dict[str, Any]] | None = None
    workload: Callable[[Any, Any, Any], Any] | None = None
    export_files: Callable[[Any, Any, Any], Any] | None = None
    peft_task_type: str | None = None
    lora_modules: Callable[[Any], list[str]] | None = None
    metrics: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    rules: tuple[Any, ...] = ()
    example: dict[str, Any] | None = None

    def class_names(self) -> dict[str, Any]:
        """model_type -> the class (name, or names) transformers builds for this task."""
        from transformers.models.auto import modeling_auto

        return dict(getattr(modeling_auto, self.mapping))

    def class_name(self, model_type: str) -> str | None:
        name = self.class_names().get(model_type)
        if isinstance(name, (list, tuple)):  # a family with several classes for one task: the first is transformers'
            name = name[0]
        return name

    def serves(self, model_type: str) -> bool:
        """Whether transformers has a class of ``model_type`` for this task."""
        return self.class_name(model_type) is not None

    def names_class(self, hf_config: Any) -> bool:
        """Whether the config's ``architectures`` names this task's class (by its name's ending, or as the class
        transformers builds for the family's task: BERT's causal LM is ``BertLMHeadModel``)."""
        if self.named is not None:
            return self.named(hf_config)
        for arch in getattr(hf_config, "architectures", None) or []:
            if (self.suffix is not None and arch.endswith(self.suffix)) or arch == self.class_name(
                hf_config.model_type
            ):
                return True
        return False


@dataclass(frozen=True)
class PlanAsk:
    """What ``bigtrain plan`` (or ``bigtrain.plan``) was asked, as a task's ``sizes`` reads it: the model's config
    dict, the recipe if any, the sizes given (None: not given), the method, the GPUs and how the caller spells its
    arguments (``api.request.Spelling``: ``--seq-len`` or ``seq_len=``)."""

    model_config: dict[str, Any]
    recipe: Any
    seq_len: int | None
    image_size: int | None
    images_per_row: float | None
    global_batch_size: int | None
    method: str
    gpus: int
    rows_per_example: int
    spell: Any
