"""What an objective spec is: everything one ``train.objective`` decides, in one value.

An objective is one module of ``bigtrain/objectives`` ending in ``OBJECTIVE = ObjectiveSpec(...)`` and its name on
one line of ``RECORDS`` there. It says what it reads of the model (token rows or examples, ``reads``), what data it
needs when the task's is not enough (pairs), the models it needs besides the policy (``roles``: plan dimensions of
the capability table, such as ``reference``, with their memory and time terms), the loss it computes (``make``: a
``losses.base.Objective``, its sum and the count it is normalised by over the global batch, its metrics and
evaluation sums) and any pass before training. The engines drive the loss it makes and never learn which objective
runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ObjectiveSpec:
    """One objective (``train.objective``).

    - ``reads``: what of the model's output it needs (``tasks.spec.TOKEN_ROWS`` or ``EXAMPLES``): a task whose model
      gives something else is refused at start-up with ``refusal(task)``'s words;
    - ``make(built, train) -> losses.base.Objective``: its loss for a built model (the LM head of a chunked loss,
      the autocast dtype, compile, the router's weight) and the recipe's ``train`` section;
    - ``rows_per_example``: rows of a micro-batch per example the global batch counts (a pair: its chosen and its
      rejected answer, 2); ``roles``: the capability table's role records it needs (``reference``);
    - ``read_data(cfg, hf_config) -> (data, held_out)``: data of its own (pairs), which replaces the task's; None:
      the task's;
    - ``synthetic(hf_config, plan, workload, device) -> batch`` and ``count(batch, workload, plan)``: its micro-batch
      and the global batch's count for the simulator, when it has data of its own;
    - ``roles_of(train)``: the roles a recipe's train section needs, where it decides them (grpo: the reference only
      with a KL term); None: ``roles``; ``train_of_roles(roles)``: the train keys that give it those roles;
    - ``check(cfg)``: its recipe values (one line naming the key), before anything is read;
    - ``attach(engine, options, train)``: its roles onto the engine (a live reference), after the engine is built;
    - ``before_training(cfg, plan, engine, datasets, resuming, device)``: a pass before the first step (the
      precomputed reference);
    - ``step_source(cfg, plan, engine, data, device, resumed)``: where each step's micro-batches come from when
      they are made during training (online RL's rollouts: a callable of the step like the data's ``StepLoader``,
      with ``state(step)``, what a checkpoint after ``step`` keeps of it, and ``resumed`` that state read back);
      None: read from the data;
    - ``keys``, ``rules``: the recipe keys it reads and its own rows of what runs together.
    """

    name: str
    summary: str
    reads: str
    make: Callable[[Any, Any], Any]
    rows_per_example: int = 1
    roles: tuple[str, ...] = ()
    read_data: Callable[[Any, Any], tuple[Any, Any]] | None = None
    synthetic: Callable[[Any, Any, Any, Any], Any] | None = None
    count: Callable[[Any, Any, Any], float] | None = None
    check: Callable[[Any], None] | None = None
    roles_of: Callable[[Any], tuple[str, ...]] | None = None
    # the train keys that give it these roles, the inverse of roles_of (the simulator's train section: grpo's KL)
    train_of_roles: Callable[[tuple[str, ...]], dict[str, Any]] | None = None
    # what each step generates before it trains, for a train section and a prompt length (None: its default):
    # a ``config.workload.Generation`` (grpo's rollouts); None: the step reads its rows from data
    generation: Callable[[Any, int | None], Any] | None = None
    attach: Callable[[Any, Any, Any], None] | None = None
    before_training: Callable[..., None] | None = None
    step_source: Callable[..., Any] | None = None
    # train keys an example recipe of the objective must set (docs/generate.py's jobs; grpo's reward functions)
    example_train: tuple[tuple[str, Any], ...] = ()
    keys: tuple[str, ...] = ()
    rules: tuple[Any, ...] = ()
    refusal: Callable[[str], str] | None = None  # what a task whose model gives other outputs is told
    batch_noun: str = ""  # what the global batch counts where the objective's data says (pairs); "": the task's
    # step metrics the progress bar and the last line show (with their eval_ values once evaluated), in order
    shown: tuple[str, ...] = ()
    # the objective as TRL's DPOTrainer runs it: its DPOConfig loss_type for the recipe's train section (None: none)
    trl_dpo_loss: Callable[[Any], str] | None = None

    def refused(self, task: str) -> str:
        if self.refusal is not None:
            return self.refusal(task)
        return f"train.objective={self.name} reads {self.reads}, which a {task} model does not give"
