"""What a capability record is, what a row of the table of what runs together is, and how the rows are asked.

A row is one function of a :class:`Setup` (the plan, the recipe's ``train`` options, and the model's and the data's
facts once they are known) that returns the one line a user gets when the row trips (naming the recipe key and what
would work), or None. A row has a kind, which is what the planner makes of it:
- ``invalid``: the plan contradicts itself (ddp with dp_shard > 1); the planner never proposes one.
- ``fit``: the plan does not fit this model, this batch or this data (tp does not divide the heads); shown as
  rejected.
- ``not_built``: the trainer cannot run it yet (cp with pp); ``bigtrain plan --all`` predicts it anyway.
Rows that read the model, the data or the job (its task and objective) are skipped while their facts are unknown
(recipe resolution runs before the model is read); start-up and the planner ask again with them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from bigtrain.config.model_facts import ModelFacts
from bigtrain.config.plan import Plan
from bigtrain.config.setup import JobFacts, Setup

Kind = Literal["invalid", "fit", "not_built"]
KINDS: tuple[Kind, ...] = ("invalid", "not_built", "fit")  # the order rows are asked in: the first that trips is said


@dataclass(frozen=True)
class Rule:
    name: str
    kind: Kind
    says: Callable[[Setup], str | None]  # the message when the row trips, else None
    reads_model: bool = False  # asked only once the model's facts are known
    reads_data: bool = False  # asked only once the data's facts (row length, packing, attention) are known
    # reads the micro-batch or the checkpointing: the search asks the other rows once per layout (a frame), and
    # tests/unit/test_capabilities.py holds every row not marked so to a verdict they do not change
    reads_micro_batch: bool = False
    reads_job: bool = False  # asked only once the job's task and objective are known (``Setup.job``)


@dataclass(frozen=True)
class Problem:
    rule: Rule
    message: str


def row(
    says: Callable[[Setup], str | None],
    kind: Kind,
    reads_model: bool = False,
    reads_data: bool = False,
    reads_micro_batch: bool = False,
    reads_job: bool = False,
) -> Rule:
    """A row named after its function (``_cp_backends`` -> ``cp_backends``)."""
    return Rule(says.__name__.lstrip("_"), kind, says, reads_model, reads_data, reads_micro_batch, reads_job)


@dataclass(frozen=True)
class SearchSpace:
    """What a capability's search variants may read: the model, the cluster's shape, the workload and the pins.

    ``rides_along(base, variant)`` asks the table whether the trainer runs ``base`` and ``variant`` trips no row that
    ``base`` does not, so a capability that rides along where it can (tp's loss and sequence parallelism) is chosen
    by the table's rows, never by a copy of them."""

    facts: ModelFacts
    gpus_per_node: int
    seq_len: int
    global_batch_size: int
    fixed: Mapping[str, Any]
    rides_along: Callable[[Plan, Plan], bool] = field(repr=False, compare=False, default=lambda base, v: True)
    contradicts: Callable[[Plan], bool] = field(repr=False, compare=False, default=lambda plan: False)  # invalid rows
    # the first row of kind invalid or fit that trips for a plan, asking only rows that do not read the micro-batch
    # or the checkpointing (what is true of a layout's every plan): None, or (kind, message)
    frame_problem: Callable[[Plan], tuple[str, str] | None] = field(
        repr=False, compare=False, default=lambda plan: None
    )
    # groups of GPUs joined by a slow link the user described (sites, or nodes on Ethernet); 0: none described
    link_groups: int = 0
    on_gpus: bool = True  # the plans run on GPUs (CPU processes: what only a GPU gains from is not weighed)
    job: JobFacts = field(default_factory=JobFacts)  # the job's task and objective (a role's placement is searched)
    method: str = "full"  # train.method, concrete (the search runs once per method under auto)
    modules_to_save: bool = False  # lora.modules_to_save names modules trained fully beside the adapters
    _memo: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False, compare=False)

    def pinned(self, key: str) -> bool:
        return key in self.fixed

    def per_layout(self, what: str, plan: Plan, decide: Callable[[Plan], Any]) -> Any:
        """``decide(plan)``, asked once per layout (``LAYOUT_FIELDS``) for ``what``: a search generates hundreds of
        thousands of plans from a few thousand layouts, and a decision that reads nothing else is the same for all
        of a layout's plans."""
        key = (what, _layout_of(plan))
        if key not in self._memo:
            self._memo[key] = decide(plan)
        return self._memo[key]


# what makes a plan's layout (the world's split and where the state lives): the fields a per-layout decision may read
LAYOUT_FIELDS = (
    "backend", "zero_stage", "dp_replicate", "dp_shard", "tp", "pp", "pp_schedule", "pp_virtual_stages", "cp", "ep",
    "offload_optimizer", "offload_params", "grad_reduce",
)  # fmt: skip
_layout_of = operator.attrgetter(*LAYOUT_FIELDS)
Variants = Callable[[list[Plan], SearchSpace], list[Plan]]


@dataclass(frozen=True)
class Option:
    """A recipe key a capability brings with it, under ``parallel`` (a plan dimension the search may set): read in
    recipes, ``--set`` and ``--fix`` like the schema's own keys, carried on the plan (``Option.of``) and written
    back into plan.json and the run's recipe."""

    name: str  # the key under parallel
    default: Any
    doc: str
    example: Any = None  # a value that turns it on: its row of the README's generated capability matrix

    @property
    def key(self) -> str:
        return f"parallel.{self.name}"

    def of(self, plan: Plan) -> Any:
        """Its value in ``plan`` (resolution and the search set every option; a plan made otherwise has the default)."""
        for name, value in plan.options:  # a dozen pairs: a scan beats building a dict (asked per plan and row)
            if name == self.name:
                return value
        return self.default


@dataclass(frozen=True)
class ModelStep:
    """A model transform a capability brings with it, applied right after the transform named ``after`` in
    ``parallel/transforms``' ``ORDER``. Its code is ``apply`` (the built model and the build context, as a
    ``Transform``'s), or, for code that needs torch and the build's types, the module of ``parallel/transforms`` that
    holds it (``code``: its ``TRANSFORM``), so that a record stays a plain value every layer can read; ``wanted``
    takes the build's options (None: the code's own)."""

    name: str
    after: str
    wanted: Callable[[Any], bool] | None = None
    apply: Callable[[Any, Any], None] | None = None
    planner_terms: tuple[str, ...] = ()
    code: str | None = None  # e.g. "bigtrain.parallel.transforms.batch_norm"


@dataclass(frozen=True)
class Capability:
    """Everything bigtrain knows about one capability, in one record (``capabilities/<name>.py``).

    - ``keys``: the recipe keys it reads (dotted, documented in ``config/schema.py``);
    - ``rules``: its rows of what runs together (``invalid``, ``fit``, ``not_built``);
    - ``variants``: how the planner's search weighs it: given the plans generated so far, the plans with this
      capability's settings added (the search judges every one through the rows, and shows what they refuse);
    - ``pinned_only``: its variants carry only a value the user pinned (``--fix``, a recipe), and weigh nothing;
    - ``transforms``: the names of its model transforms in ``parallel/transforms`` (applied in their ``ORDER``;
      each transform names the planner functions that model its memory and time, ``planner_terms``);
    - ``summary``: its line in the generated capability list (``docs/architecture.md``).
    A capability that is not one of the schema's may bring everything else it needs in its record too:
    - ``options``: its recipe keys (``Option``, under ``parallel``), which the loader accepts and the plan carries;
    - ``steps``: its model transforms (``ModelStep``), placed in the build's order after a named one;
    - ``memory``: the bytes per device it adds to the predicted peak, given the planner's model statistics, the plan
      and the ``Workload`` (added to the estimate's ``other``);
    - ``time``: the seconds of compute it adds to a step, given the statistics, the plan, the cluster, the workload
      and the step's compute seconds so far;
    - ``host``: the bytes of host memory per GPU it keeps (an offloaded copy), given the statistics, plan, workload;
    - ``explain``: the lines it adds below the plan table, given the chosen candidate, the ranked runnable ones and
      the workload;
    - ``engine``: the module whose ``wrap(engine, options, train)`` wraps the engine a plan of it runs on (replica
      groups that synchronise every H steps), as ``ModelStep.code`` names code of a higher layer;
    - ``export_note``: given an export target and the plan, the line that says what the target cannot express of it
      (appended to the export's notes), or None;
    - ``one_length``: given the plan, the recipe's train section and the model's config, whether it needs every
      micro-batch of one length (right-padded rows are then not cut to their longest: ``train/padding.py``);
    - ``length_multiple``: given the plan and the train section, the multiple a cut micro-batch's length must be.
    """

    name: str
    summary: str
    keys: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = ()
    variants: Variants | None = None
    pinned_only: bool = False  # its variants only carry a value the user pinned: the search weighs none
    transforms: tuple[str, ...] = ()
    options: tuple[Option, ...] = ()
    steps: tuple[ModelStep, ...] = ()
    memory: Callable[[Any, Plan, Any], int] | None = None
    time: Callable[[Any, Plan, Any, Any, float], float] | None = None
    host: Callable[[Any, Plan, Any], int] | None = None
    explain: Callable[[Any, list[Any], Any], list[str]] | None = None
    engine: str | None = None
    export_note: Callable[[str, Plan], str | None] | None = None
    one_length: Callable[[Plan, Any, Any], bool] | None = None
    length_multiple: Callable[[Plan, Any], int] | None = None


def split_settings(plan: Plan) -> tuple[tuple[str, Any, Any], ...]:
    """(key, value, default) of what splits a decoder's blocks, heads, sequence or vocabulary, and the chunked loss:
    what a task or objective that needs whole rows and logits on one rank refuses while unbuilt."""
    return (
        ("tp", plan.tp, 1),
        ("pp", plan.pp, 1),
        ("cp", plan.cp, 1),
        ("ep", plan.ep, 1),
        ("loss_parallel", plan.loss_parallel, False),
        ("sequence_parallel", plan.sequence_parallel, False),
        ("loss_chunk_tokens", plan.loss_chunk_tokens, 0),
    )


def first_unbuilt(task: str, settings: Iterable[tuple[str, Any, bool, str]]) -> str | None:
    """The line for the first of ``settings`` (key, value as the recipe wrote it, whether it is set, what to set it
    to instead) that is set: a train- or plan-level option not built for ``task``; None if none is set."""
    for key, value, on, off in settings:
        if on:
            return f"{key}={value} with model.task={task} is not built yet; set {key}={off}"
    return None


def with_pins(plans: Iterable[Plan], space: SearchSpace, *keys: str) -> list[Plan]:
    """``plans`` with the pinned values of ``keys`` set (a pin replaces the search's own choices for its key)."""
    pins = {k: space.fixed[k] for k in keys if k in space.fixed}
    return [p.but(**pins) for p in plans] if pins else list(plans)
