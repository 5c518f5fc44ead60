"""``bigtrain.plan`` and ``bigtrain plan`` for image and sequence classifiers: the request read from the arguments
and the recipe, the search (``planner/classifier_plan.py``), and the result a person reads: the candidates, the
choice and why, and the speed-up from 1 GPU to the asked count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bigtrain.api.request import Hardware, Spelling, cluster_of, no_gpu_message, parse_fix
from bigtrain.config.plan import Plan
from bigtrain.config.schema import PRECISIONS, RecipeConfig
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.planner.classifier_plan import Candidate, ScalingRow, candidates, plan_name, scaling, table_lines
from bigtrain.planner.hardware import Cluster, count, size

if TYPE_CHECKING:  # measured with torch (fake tensors): planning a causal LM imports no torch
    from bigtrain.planner.classifier_stats import ClassifierStats

# examples per GPU in a step when no batch is given: NVIDIA's ResNet-50 AMP recipe takes 256 images per GPU; BERT
# fine-tuning recipes take 32 sequences
DEFAULT_PER_GPU = {"images": 256, "examples": 32}
DEFAULT_SEQ_LEN = 512
NOT_PLANNED = {  # arguments the classifier planner does not weigh (they are rows of the capability table)
    "compile": False,
    "fp8": "none",
}
METHODS = ("full", "lora")  # what trains a classifier (QLoRA is a row of the table)


@dataclass(frozen=True)
class ClassifierPlanResult:
    stats: ClassifierStats
    model_config: dict[str, Any]
    cluster: Cluster
    workload: Workload
    searched: list[Candidate]
    scaling: list[ScalingRow]

    @property
    def best(self) -> Candidate:
        return self.searched[0]

    @property
    def plan(self) -> Plan:
        return self.best.plan

    @property
    def fits(self) -> bool:
        return self.best.fits

    @property
    def memory(self) -> Any:
        return self.best.memory

    @property
    def time(self) -> Any:
        return self.best.time

    @property
    def micro_batch_size(self) -> int:
        return self.plan.micro_batch_size

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.plan.grad_accum_steps(self.workload.global_batch_size)

    def summary(self) -> str:
        return f"{plan_name(self.plan)}, micro-batch {self.micro_batch_size} x {self.gradient_accumulation_steps} steps"

    def export(self, target: str, gpus_per_node: int | None = None) -> Any:
        raise ConfigError(
            f"model.task={self.stats.task}: plan exports (accelerate, DeepSpeed, HF Trainer configs) model causal "
            "LMs only; bigtrain train runs this plan as it is"
        )

    def what_would_fit(self) -> str | None:
        if self.fits:
            return None
        need = self.best.memory.budget_bytes
        return (
            f"the smallest plan ({plan_name(self.plan)}, micro-batch {self.micro_batch_size}) needs {size(need)} "
            "per GPU; "
            "use GPUs with more memory, more GPUs (FSDP2 and ZeRO shard the weights and optimizer states), or a "
            "smaller image size or row length"
        )

    def simulate(self) -> dict[str, Any]:
        """The chosen plan's training step on fake tensors (``measure/simulate.py``): rank 0's peak."""
        from bigtrain.measure.simulate import simulate

        peak = simulate(self.model_config, self.plan, self.workload)
        return {"peak_bytes": peak["Total"], "by_kind": peak}

    def to_dict(self, include_unrunnable: bool = False) -> dict[str, Any]:
        unit = self.stats.unit
        return {
            "model": {
                "model_type": self.stats.model_type,
                "task": self.stats.task,
                "params": self.stats.params,
                "example": self.stats.example,
                "flops_per_example": self.stats.flops_per_example,
            },
            "cluster": {"gpu": self.cluster.gpu.name, "gpus": self.cluster.num_gpus},
            "global_batch_size": self.workload.global_batch_size,
            "plan": self.plan.to_dict(),
            "fits": self.fits,
            "memory_bytes": self.memory.budget_bytes,
            "step_s": self.time.step_s,
            f"{unit}_per_s": self.time.per_s,
            "candidates": [
                {
                    "plan": plan_name(c.plan),
                    "micro_batch_size": c.plan.micro_batch_size,
                    "memory_bytes": c.memory.budget_bytes,
                    "step_s": c.time.step_s,
                    "fits": c.fits,
                }
                for c in self.searched
            ],
            "scaling": [
                {"gpus": r.gpus, f"{unit}_per_s": r.per_s, "speedup": r.speedup, "efficiency": r.efficiency}
                for r in self.scaling
            ],
        }

    def explain(self, show_unrunnable: bool = False) -> str:
        s, c, w, unit = self.stats, self.cluster, self.workload, self.stats.unit
        lines = [
            f"model: {s.describe}: {count(s.params)} params, {_gflop(s.flops_per_example)} GFLOP per "
            f"{unit[:-1]} (forward + backward)",
            f"cluster: {c.num_gpus} x {c.gpu.name} ({size(c.gpu.memory_bytes)} each); global batch "
            f"{w.global_batch_size} {unit}, {w.mixed_precision}"
            + (f"; LoRA r={w.lora_rank}: {count(s.lora_params(w.lora_rank))} trained" if w.method == "lora" else ""),
            "",
            *table_lines(self.searched, w, unit),
        ]
        lines += ["", f"chosen: {self.summary()}. {self._why()}", ""]
        lines += self._scaling_lines()
        lines += [
            "",
            "each row: the backend's best micro-batch (micro: examples per forward, accum: micro-steps per step);",
            "memory/GPU: predicted peak plus a margin for the CUDA context, NCCL and the allocator; step: one",
            "optimizer step; ac: every block under full activation checkpointing; nhwc: parallel.channels_last (a",
            "CNN on GPUs). FLOPs and activations measured on fake tensors at this size. Not weighed: HSDP.",
        ]
        return "\n".join(lines)

    def _why(self) -> str:
        fitting = [x for x in self.searched if x.fits]
        if not fitting:
            return "Nothing fits: " + (self.what_would_fit() or "")
        best = self.best
        fastest = min(fitting, key=lambda x: x.time.step_s)
        if fastest is not best:
            slower = best.time.step_s / fastest.time.step_s - 1
            return (
                f"A near tie with {plan_name(fastest.plan)} (micro-batch {fastest.plan.micro_batch_size}, {slower:.1%} "
                "faster predicted): the simpler plan is taken."
            )
        if best.plan.backend == "ddp":
            return "The fastest plan that fits: the whole model and its optimizer fit one GPU, so nothing is sharded."
        return "The fastest plan that fits; DDP would not fit or is slower."

    def _scaling_lines(self) -> list[str]:
        unit, per_gpu = self.stats.unit, self.workload.global_batch_size // self.cluster.num_gpus
        lines = [
            f"scaling of this plan, {per_gpu} {unit} per GPU per step (1 GPU to {self.cluster.num_gpus}):",
            f"  {'GPUs':>4}  {unit + '/s':>10}  {'speed-up':>8}  {'efficiency':>10}  {'grad traffic':>12}  "
            f"{'not hidden':>10}",
        ]
        for r in self.scaling:
            lines.append(
                f"  {r.gpus:>4}  {r.per_s:>10,.0f}  {r.speedup:>7.2f}x  {r.efficiency:>10.0%}  "
                f"{r.comm_s * 1e3:>9.1f} ms  {r.exposed_s * 1e3:>7.1f} ms{'' if r.fits else '  (does not fit)'}"
            )
        hidden = [r for r in self.scaling if r.gpus > 1 and r.exposed_s > 0.11 * r.comm_s]
        if hidden:
            lines.append(
                f"  from {hidden[0].gpus} GPUs on, gradient traffic outlasts backward and the GPUs wait for it"
            )
        elif len(self.scaling) > 1:
            lines.append(
                "  gradient traffic hides behind backward at every count (all but its last bucket, 10%, shown as "
                "not hidden)"
            )
        return lines


def written_classifier_plan(
    model_config: dict[str, Any], cfg: RecipeConfig, plan: Plan, cluster: Cluster
) -> ClassifierPlanResult:
    """A recipe's written plan for a classifier, predicted (what ``bigtrain train`` runs)."""
    from bigtrain.planner.classifier_plan import estimate_memory, estimate_time
    from bigtrain.planner.classifier_stats import measure_classifier

    side, length = _example_size(model_config, cfg, None, None)
    stats = measure_classifier(model_config, side, length, cfg.train.mixed_precision)
    workload = Workload(
        seq_len=max(length, 1),
        global_batch_size=cfg.train.global_batch_size,
        mixed_precision=cfg.train.mixed_precision,
        image_size=side,
        method=cfg.train.method if cfg.train.method in METHODS else "full",
        lora_rank=cfg.lora.r,
    )
    memory = estimate_memory(stats, plan, workload)
    found = [
        Candidate(
            plan, memory, estimate_time(stats, plan, cluster, workload), memory.budget_bytes <= cluster.gpu.memory_bytes
        )
    ]
    return ClassifierPlanResult(stats, model_config, cluster, workload, found, scaling(stats, plan, cluster, workload))


def _gflop(flops: float) -> str:
    return f"{flops / 1e9:,.0f}" if flops >= 1e11 else f"{flops / 1e9:.3g}"


def plan_classifier(
    model_config: dict[str, Any],
    cfg: RecipeConfig | None,
    hw: Hardware,
    spell: Spelling,
    *,
    image_size: int | None = None,
    seq_len: int | None = None,
    global_batch_size: int | None = None,
    mixed_precision: str | None = None,
    fix: dict[str, Any] | list[str] | None = None,
    cluster: Cluster | None = None,
    method: str | None = None,
    lora_r: int | None = None,
    **not_planned: Any,
) -> ClassifierPlanResult:
    """The classifier planner's answer for a model dict (its task in ``architectures``) on ``hw``."""
    method = method or (cfg.train.method if cfg else "full")
    if method not in METHODS:
        raise ConfigError(
            f"{spell.value('method', method)}: classifiers train with method full or lora (the capability table "
            "lists why not the others)"
        )
    for name, value in not_planned.items():
        if value not in (None, NOT_PLANNED[name]):
            raise ConfigError(
                f"{spell.value(name, value)}: the planner plans classifiers with {name}={NOT_PLANNED[name]} only "
                "(the capability table lists what else trains them)"
            )
    if mixed_precision is not None and mixed_precision not in PRECISIONS:
        raise ConfigError(f"{spell.value('mixed_precision', mixed_precision)} is not one of {', '.join(PRECISIONS)}")
    cluster = cluster or cluster_of(hw, no_gpu_message(spell), spell)
    if image_size and not _is_image(model_config):
        raise ConfigError(f"{spell('image_size')} is for image models; a sequence classifier takes --seq-len")
    side, length = _example_size(model_config, cfg, image_size, seq_len)
    if side and side < 8:
        raise ConfigError(f"{spell.value('image_size', side)} is too small; use at least 8 (224 for ImageNet)")
    limit = model_config.get("max_position_embeddings")
    if length and limit and length > limit:
        raise ConfigError(f"{spell.value('seq_len', length)} is more than the model's {limit} positions")
    from bigtrain.planner.classifier_stats import measure_classifier

    precision = mixed_precision or (cfg.train.mixed_precision if cfg else "bf16")
    stats = measure_classifier(model_config, side, length, precision)
    if method == "lora" and not stats.adapted:
        raise ConfigError(
            f"{spell.value('method', method)}: {stats.model_type}'s blocks hold no linear layer (a CNN's are "
            "convolutions), and LoRA here adapts linears; plan it with method full"
        )
    rank = lora_r or (cfg.lora.r if cfg else 16)
    batch = global_batch_size or (cfg.train.global_batch_size if cfg else 0)
    batch = batch or DEFAULT_PER_GPU[stats.unit] * cluster.num_gpus
    n = cluster.num_gpus
    if batch < 1 or batch % n:
        lower = batch // n * n
        raise ConfigError(
            f"{spell.value('global_batch_size', batch)} does not divide over {n} GPUs; try {lower or n} or {lower + n}"
        )
    workload = Workload(
        seq_len=max(length, 1),
        global_batch_size=batch,
        mixed_precision=precision,
        image_size=side,
        method=method,
        lora_rank=rank,
    )
    found = candidates(stats, cluster, workload, parse_fix(fix or [], spell))
    rows = scaling(stats, found[0].plan, cluster, workload)
    return ClassifierPlanResult(stats, model_config, cluster, workload, found, rows)


def classifier_model(model: Any, recipe: Any, spell: Spelling) -> tuple[dict[str, Any], RecipeConfig | None] | None:
    """(the model dict, the recipe) when what ``bigtrain.plan`` was given is an image or sequence classifier (its
    task from the config or the recipe's model.task), else None: a causal LM, planned by the LM planner."""
    from bigtrain.api.request import model_config_of
    from bigtrain.config.hf import model_config_object
    from bigtrain.config.load import load_recipe
    from bigtrain.config.tasks import TASKS, task_of
    from bigtrain.planner.known_configs import recorded_facts

    cfg = recipe if isinstance(recipe, RecipeConfig) or recipe is None else load_recipe(recipe)
    if model is not None:
        model_config, _ = model_config_of(model, spell)
    elif cfg is not None:
        from bigtrain.models.build import load_hf_config

        hf_config = load_hf_config(cfg.model)
        model_config = {**hf_config.to_dict(), "model_type": hf_config.model_type}
    else:
        return None
    facts = recorded_facts(model_config)  # a preset: its task without importing transformers
    task = TASKS[facts.task] if facts is not None else task_of(model_config_object(model_config))
    if not task.examples:
        return None
    return model_config, cfg


def _is_image(model_config: dict[str, Any]) -> bool:
    from bigtrain.config.hf import model_config_object
    from bigtrain.config.tasks import task_of

    return task_of(model_config_object(model_config)).unit == "images"


def _example_size(
    model_config: dict[str, Any], cfg: RecipeConfig | None, image_size: int | None, seq_len: int | None
) -> tuple[int, int]:
    """(pixels a side, 0) of an image classifier's examples, or (0, tokens a row) of a sequence classifier's: the
    argument, else the recipe's, else the model's own image size (or 224), or DEFAULT_SEQ_LEN tokens."""
    if _is_image(model_config):
        return image_size or (cfg and cfg.data.image_size) or model_config.get("image_size") or 224, 0
    return 0, seq_len or (cfg and cfg.data.seq_len) or DEFAULT_SEQ_LEN
