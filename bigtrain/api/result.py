"""What ``bigtrain.plan`` returns: the chosen plan with its predicted memory and time, the ranked alternatives with
why each lost, the table that explains it, and the plan converted for HF Trainer, TRL, accelerate, DeepSpeed or a
bigtrain recipe (``convert.py``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from bigtrain.config.load import build_dataclass, check_ranges, recipe_to_dict
from bigtrain.config.plan import Plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.config.workload import Workload
from bigtrain.planner.cost import TimeEstimate
from bigtrain.planner.explain import candidate_name, describe, render_table, to_json, why_not
from bigtrain.planner.hardware import Cluster, size
from bigtrain.planner.memory_terms import MemoryEstimate
from bigtrain.planner.scaling import ScalingRow, scaling, scaling_lines
from bigtrain.planner.search import Candidate

if TYPE_CHECKING:
    from accelerate.utils import DeepSpeedPlugin  # noqa: F401
    from transformers import TrainingArguments

    from bigtrain.api.request import PlanRequest
    from bigtrain.integrations import Export


@dataclass(frozen=True)
class RankedPlan:
    """One candidate as the ranking saw it. ``why_not``: None for the choice, else why it lost (slower by how much,
    over which budget, or what the trainer cannot run)."""

    rank: int
    name: str  # the table's one-line name, e.g. "fsdp2 zero3 dp=8 tp=1 pp=1 ac=none mb=2 rs=micro"
    plan: Plan
    method: str
    compile: bool | str
    fp8: str
    peak_bytes: int
    budget_bytes: int
    step_s: float
    tokens_per_s_per_device: float
    fits: bool
    runnable: bool
    why_not: str | None


@dataclass(repr=False)
class PlanResult:
    """A plan for a model on some GPUs, with the reasoning.

    ``plan`` is the chosen layout (its fields are the recipe's ``parallel.`` keys); ``method``, ``compile`` and
    ``fp8`` the train options it was chosen with; ``memory`` and ``time`` its predicted peak per GPU (bytes, by
    part) and step; ``fits`` whether it fits and the trainer runs it. ``candidates`` ranks the alternatives.
    """

    request: PlanRequest
    searched: list[Candidate]  # ranked, the choice first (the search ranks the plans the trainer can run first)

    def __repr__(self) -> str:
        return f"PlanResult({self.summary()})"

    @property
    def plan(self) -> Plan:
        return self.searched[0].plan

    @property
    def method(self) -> str:
        return self.searched[0].method

    @property
    def compile(self) -> bool | str:
        return self.searched[0].compile

    @property
    def fp8(self) -> str:
        return self.searched[0].fp8

    @property
    def fits(self) -> bool:
        return self.searched[0].fits and self.searched[0].runnable

    @property
    def memory(self) -> MemoryEstimate:
        return self.searched[0].memory

    @property
    def time(self) -> TimeEstimate:
        return self.searched[0].time

    @property
    def model(self) -> Any:
        """The task's statistics of the model (``ModelStats`` for a causal LM, ``ClassifierStats`` for a classifier)."""
        return self.request.stats

    @property
    def cluster(self) -> Cluster:
        return self.request.cluster

    @property
    def workload(self) -> Workload:
        return self.request.workload

    @property
    def micro_batch_size(self) -> int:
        return self.plan.micro_batch_size

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.plan.grad_accum_steps(self.workload.global_batch_size)

    @property
    def predicted_peak_bytes(self) -> int:
        """The predicted peak of tensor memory on the busiest GPU (what ``torch.cuda.max_memory_allocated`` reads)."""
        return self.memory.total_bytes

    def candidates(self, limit: int = 20, include_unrunnable: bool = False) -> list[RankedPlan]:
        """The best ``limit`` fitting plans, then the best ``limit`` rejected ones (and with ``include_unrunnable``
        the plans the trainer cannot run yet), each with why it lost to the choice."""
        runnable = [c for c in self.searched if c.runnable]
        shown = [c for c in runnable if c.fits][:limit] + [c for c in runnable if not c.fits][:limit]
        if include_unrunnable:
            shown += [c for c in self.searched if not c.runnable][:limit]
        return [self._ranked(i, c) for i, c in enumerate(shown)]

    def _ranked(self, rank: int, c: Candidate) -> RankedPlan:
        why = why_not(c, self.searched[0])  # the words of the CLI's table
        return RankedPlan(
            rank,
            candidate_name(c),
            c.plan,
            c.method,
            c.compile,
            c.fp8,
            c.memory.total_bytes,
            c.memory.budget_bytes,
            c.time.step_s,
            c.time.tokens_per_s_per_device,
            c.fits and c.runnable,
            c.runnable,
            why,
        )

    def explain(self, show_unrunnable: bool = False, scaling: bool | None = None) -> str:
        """The table ``bigtrain plan`` prints: the fitting plans ("*" the choice), the best rejected ones and why;
        the scaling from one GPU (``scaling``; None: where the model's task shows it, a classifier's)."""
        r = self.request
        appendix = None
        if r.model.scaling_view if scaling is None else scaling:
            per_gpu = self.workload.global_batch_size * self._rows_per_count() // self.cluster.num_gpus
            appendix = scaling_lines(self.scaling(), self.workload.job.unit, per_gpu)
        return render_table(
            self.searched, r.model, self.cluster, self.workload, show_unrunnable=show_unrunnable, appendix=appendix
        )

    def _rows_per_count(self) -> int:
        """What one counted example of the global batch is in the task's unit (a token row: its tokens; a reward
        model's pair: its two answers)."""
        return self.workload.seq_len if self.workload.job.unit == "tokens" else self.workload.job.rows_per_example

    def scaling(self) -> list[ScalingRow]:
        """The chosen plan's kind from one GPU (or its model-parallel group) to the asked count (``scaling.py``)."""
        return scaling(self.request.model, self.plan, self.cluster, self.workload)

    def to_dict(self, include_unrunnable: bool = False) -> dict[str, Any]:
        """What ``bigtrain plan --json`` prints (with the scaling view where the task shows it)."""
        out = to_json(self.searched, self.request.model, include_unrunnable=include_unrunnable)
        if self.request.model.scaling_view:
            unit = self.workload.job.unit
            out["scaling"] = [
                {"gpus": r.gpus, f"{unit}_per_s": r.per_s, "speedup": r.speedup, "efficiency": r.efficiency}
                for r in self.scaling()
            ]
        return out

    def what_would_fit(self) -> str | None:
        """When nothing fits: one sentence naming what would (more GPUs, offload, a shorter sequence); else None."""
        if self.fits:
            return None
        from bigtrain.api.alternatives import alternatives_that_fit
        from bigtrain.planner.explain import what_would_fit

        return what_would_fit(alternatives_that_fit(self.request))

    def simulate(self) -> dict[str, Any]:
        """The chosen plan's peak memory measured by running its training step on fake tensors (one rank of the
        plan's world, simulated here in seconds): ``{"peak_bytes", "world_size"[, "pp_rank"]}``. A ConfigError
        says why a plan cannot be simulated."""
        from bigtrain.errors import ConfigError
        from bigtrain.measure.simulate import not_simulated, simulate

        reason = not_simulated(self.plan)
        if reason is not None:
            raise ConfigError(f"the chosen plan cannot be simulated: {reason}")
        workload = replace(self.workload, method=self.method, compile=self.compile, fp8=self.fp8)
        peak = simulate(self.request.model_config, self.plan, workload)
        out = {"peak_bytes": peak["Total"], "world_size": self.plan.world_size}
        if "pp_rank" in peak:  # pipelined: every pp rank was simulated, this is the busiest
            out["pp_rank"] = peak["pp_rank"]
        return out

    # ---- conversions: the plan as the objects other tools take (convert.py) ----

    def to_recipe(self) -> dict[str, Any]:
        """A bigtrain recipe (plain data, as the YAML holds it) that runs this plan: the request's recipe, or the
        model, sequence and batch it was planned for, with ``parallel`` set to the plan and the chosen method,
        compile and FP8."""
        req = self.request
        raw = recipe_to_dict(req.recipe) if req.recipe is not None else {"data": {}, "train": {}, "lora": {}}
        if req.recipe is None or req.model_given:  # the model planned for, which wins over the recipe's
            kept = {k: v for k, v in raw.get("model", {}).items() if k not in ("name_or_path", "config")}
            model = {"name_or_path": req.model_source} if req.model_source else {"config": dict(req.model_config)}
            raw["model"] = {**kept, **model}
        raw["lora"]["r"] = self.workload.lora_rank
        if self.workload.modules_to_save:
            raw["lora"]["modules_to_save"] = list(self.workload.modules_to_save)
        if self.workload.seq_len > 1:  # rows of tokens (an image classifier's examples have none)
            raw["data"]["seq_len"] = self.workload.seq_len
        if self.workload.job.unit == "images":  # an image classifier's side
            raw["data"]["image_size"] = self.workload.image_size
        raw["train"].update(
            global_batch_size=self.workload.global_batch_size,
            mixed_precision=self.workload.mixed_precision,
            method=self.method,
            compile=self.compile,
            fp8=self.fp8,
            objective=self.workload.objective,
        )
        raw["parallel"] = {"plan": "manual", **self.plan.to_dict()}
        return raw

    def recipe_config(self) -> RecipeConfig:
        """``to_recipe()`` read as ``bigtrain train`` reads a recipe (the conversions start from it)."""
        cfg = build_dataclass(RecipeConfig, self.to_recipe(), prefix="")
        check_ranges(cfg)
        return cfg

    def _conversion_inputs(self) -> tuple[RecipeConfig, Plan, dict[str, Any]]:
        return self.recipe_config(), self.plan, self.request.model_config

    def export(self, target: str, gpus_per_node: int | None = None) -> Export:
        """The plan for ``target`` (accelerate, deepspeed, hf-trainer) as plain data, with notes on what the
        translation changes: what ``bigtrain export`` writes."""
        from bigtrain.api.convert import export

        return export(self.recipe_config(), self.plan, self.request.model_config, target, gpus_per_node)

    def to_deepspeed(self) -> dict[str, Any]:
        """The complete DeepSpeed config (``deepspeed.initialize(config=...)``, ``TrainingArguments(deepspeed=...)``,
        ``DeepSpeedPlugin(hf_ds_config=...)``)."""
        from bigtrain.api.convert import to_deepspeed

        return to_deepspeed(*self._conversion_inputs())

    def to_training_arguments(self, **overrides: Any) -> TrainingArguments:
        """A ``transformers.TrainingArguments`` carrying the plan (FSDP2 / DeepSpeed / DDP, per-device batch,
        accumulation, checkpointing, precision) and the recipe's optimizer and schedule; ``overrides`` are
        TrainingArguments keywords that win (``output_dir``, ``learning_rate``, ...)."""
        from bigtrain.api.convert import to_training_arguments

        return to_training_arguments(*self._conversion_inputs(), overrides)

    def to_sft_config(self, **overrides: Any) -> Any:
        """TRL's ``SFTConfig`` (a TrainingArguments) with the plan, and ``max_length`` the planned sequence length;
        needs ``pip install 'bigtrain[trl]'``."""
        from bigtrain.api.convert import to_sft_config

        return to_sft_config(*self._conversion_inputs(), overrides)

    def to_dpo_config(self, **overrides: Any) -> Any:
        """TRL's ``DPOConfig`` (a TrainingArguments) for a dpo/ipo plan (``objective="dpo"``): the plan, ``beta``,
        ``loss_type``, ``max_length`` and the reference (``precompute_ref_log_probs`` when the plan precomputes it);
        needs ``pip install 'bigtrain[trl]'``."""
        from bigtrain.api.convert import to_dpo_config

        return to_dpo_config(*self._conversion_inputs(), overrides)

    def to_accelerate(self) -> dict[str, Any]:
        """The keyword arguments of ``accelerate.Accelerator`` for the plan: ``mixed_precision``,
        ``gradient_accumulation_steps``, and the ``fsdp_plugin`` / ``deepspeed_plugin`` / ``parallelism_config``
        objects it needs. The micro-batch (``result.micro_batch_size``) is the script's DataLoader's."""
        from bigtrain.api.convert import to_accelerate

        return to_accelerate(*self._conversion_inputs())

    def summary(self) -> str:
        """One line: the plan, its predicted peak and step time."""
        return (
            f"{describe(self.plan)}: peak {size(self.memory.total_bytes)} per GPU, "
            f"{self.time.step_s:.3f} s per step, micro-batch {self.micro_batch_size} x accumulation "
            f"{self.gradient_accumulation_steps}"
        )
