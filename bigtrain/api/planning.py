"""``bigtrain.plan``: the planner's choice for a model on some GPUs; ``bigtrain.recipe_plan``: the plan a recipe runs
(``parallel.plan: auto`` chosen the same way, a written plan resolved and predicted). ``bigtrain plan`` and
``bigtrain export`` call these, so the command line and Python cannot disagree."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from bigtrain.api.request import (
    PYTHON,
    Hardware,
    ModelSpec,
    PlanRequest,
    Spelling,
    build_request,
    cluster_of,
    planning,
    written_plan_cluster,
)
from bigtrain.api.result import PlanResult
from bigtrain.config.load import load_recipe
from bigtrain.config.resolve import resolve_plan
from bigtrain.config.schema import RecipeConfig
from bigtrain.errors import ConfigError
from bigtrain.planner.search import candidate, search


@planning
def plan(
    model: ModelSpec | None = None,
    *,
    recipe: str | Path | RecipeConfig | None = None,
    gpus: int | None = None,
    gpu: str | None = None,
    gpu_memory: str | int | None = None,
    gpus_per_node: int | None = None,
    host_memory: str | None = None,
    seq_len: int | None = None,
    global_batch_size: int | None = None,
    mixed_precision: str | None = None,
    method: str | None = None,
    lora_r: int | None = None,
    compile: bool | str | None = None,
    fp8: str | None = None,
    fix: dict[str, Any] | None = None,
    hardware_profile: str | Path | None = None,
    allow_unrunnable: bool = False,
    image_size: int | None = None,
    images_per_row: float | None = None,
    inter_node_bandwidth: str | None = None,
    inter_node_latency: str | None = None,
    sites: int | None = None,
    site_bandwidth: str | None = None,
    site_latency: str | None = None,
    objective: str | None = None,
    epochs: float | None = None,
    rollout: dict[str, Any] | None = None,
    _spell: Spelling = PYTHON,
) -> PlanResult:
    """Choose how to train ``model`` on ``gpus`` GPUs, and explain it.

    Args:
        model: a preset (``bigtrain plan --help`` lists them), a local HF folder or ``config.json``, a config dict
            with ``model_type``, a ``PretrainedConfig`` or a built model; optional when ``recipe`` names the model.
        recipe: a bigtrain recipe (path or loaded) to take the model, sequence length, batch, precision and method
            from; the other arguments win over it.
        gpus: GPUs of the job (default: this machine's). Under torchrun/accelerate, unless ``gpus`` and ``gpu`` or
            ``gpu_memory`` are all given, the whole job's: every rank is asked for its free memory, so call it on
            every rank, as a training script does; without a process group it starts the job's default one (gloo
            on CPUs, NCCL on GPUs, 30-minute timeout) and leaves it for your trainer.
        gpu, gpu_memory: GPU type, e.g. ``"H100"``, ``"L4"`` (default: detected, else H100); memory per GPU, e.g.
            ``"80GB"`` (binary units) or bytes, over the GPU table's. gpus_per_node: default ``min(gpus, 8)``.
        host_memory: host memory per node for offloaded state, e.g. ``"2TB"``.
        seq_len: tokens per sequence (default: the recipe's, else the model's maximum up to 2048).
        global_batch_size: sequences per optimizer step (default: the recipe's, else about 1M tokens).
        mixed_precision: ``"bf16"`` (default), ``"fp16"`` or ``"fp32"``; method: ``"full"`` (default), ``"lora"``,
            ``"qlora"`` or ``"auto"`` (the planner picks); lora_r: adapter rank under lora/qlora (default 16).
        compile: plan for ``torch.compile`` of the blocks (True/False/``"auto"``).
        fp8: ``"none"``, ``"tensorwise"``, ``"rowwise"`` or ``"auto"`` (needs a measured ``hardware_profile``).
        fix: plan fields to pin, e.g. ``{"backend": "deepspeed", "zero_stage": 3}``.
        hardware_profile: a ``bigtrain probe`` profile: measured rates and links instead of the GPU table's.
        allow_unrunnable: return the best plan even when the trainer cannot run it (``bigtrain plan --all``).
        image_size, images_per_row: pixels per side of an image classifier's inputs (default: the recipe's, the model's,
            or 224); of a vision-language model's images (default 448), and how many a row holds (default 1).
        inter_node_bandwidth, inter_node_latency, sites, site_bandwidth, site_latency: a slow link between nodes
            (``"100Gb/s"``, ``"25us"``) or ``sites`` equal sites (``2, "10Gb/s", "30ms"``): DiLoCo is weighed then
        objective, epochs: ``"sft"`` (default), a preference objective (``"dpo"``, ``"ipo"``, ``"orpo"``, ``"simpo"``:
            batches count pairs) or ``"grpo"`` (batches count completions); the passes over the data (default 1).
        rollout: grpo's ``prompt_length``, ``completion_length``, ``num_generations``, ``beta`` (default: the recipe's,
            else 512 prompt tokens, TRL's 512 completion tokens and 8 per prompt, beta 0: no reference model).

    Returns:
        A :class:`PlanResult` for any task (``result.plan``, ``result.explain()``, ``result.scaling()``, ...).
        ``result.fits`` is False when nothing fits; ``result.what_would_fit()`` then says what would.

    Raises:
        ConfigError: bad input, named by its argument, with what would work.
    """
    network = dict(inter_node_bandwidth=inter_node_bandwidth, inter_node_latency=inter_node_latency, sites=sites,
                   site_bandwidth=site_bandwidth, site_latency=site_latency)  # fmt: skip
    profile = str(hardware_profile) if hardware_profile else None
    hw = Hardware(gpus, gpus_per_node, gpu, gpu_memory, host_memory, profile, network)
    asked = dict(seq_len=seq_len, global_batch_size=global_batch_size, mixed_precision=mixed_precision, method=method,
                 lora_r=lora_r, compile=compile, fp8=fp8, fix=fix, image_size=image_size,
                 images_per_row=images_per_row)  # fmt: skip
    asked.update(objective=objective, epochs=epochs, rollout=rollout)
    return searched(build_request(model, recipe, hw, spell=_spell, **asked), allow_unrunnable, _spell)


def searched(
    request: PlanRequest, allow_unrunnable: bool = False, spell: Spelling = PYTHON, show_unrunnable: bool | None = None
) -> PlanResult:
    """The search's result for ``request``; a ConfigError when the pins leave only plans the trainer cannot run
    (unless ``allow_unrunnable``). Those plans are predicted and ranked where they are shown (``show_unrunnable``,
    by default as ``allow_unrunnable``)."""
    r = request
    shown = allow_unrunnable if show_unrunnable is None else show_unrunnable
    candidates = search(r.model, r.cluster, r.workload, r.fixed, predict_unrunnable=shown)
    best = candidates[0]
    if not best.runnable and not allow_unrunnable:
        raise ConfigError(
            f"no plan the planner offers meets the pins: {best.unsupported}; "
            f"add {'--all' if spell.cli else 'allow_unrunnable=True'} to see such plans predicted anyway"
        )
    return PlanResult(request, candidates)


@planning
def recipe_plan(
    recipe: str | Path | RecipeConfig,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    gpus: int | None = None,
    gpus_per_node: int | None = None,
    gpu: str | None = None,
    gpu_memory: str | int | None = None,
    hardware_profile: str | Path | None = None,
    _spell: Spelling = PYTHON,
) -> PlanResult:
    """The plan ``bigtrain train`` would run for ``recipe`` (with ``overrides``, ``"key.sub=value"`` items): a
    written plan resolved for ``gpus`` ranks (or the product of its degrees when it states them all) and predicted
    on ``gpu`` (default: detected, else H100); ``parallel.plan: auto`` chosen by the planner for ``gpus`` of ``gpu``
    / ``gpu_memory`` (or the GPUs detected here), refused when nothing fits."""
    if isinstance(recipe, RecipeConfig) and overrides:
        raise ConfigError("overrides apply to a recipe read from a file: pass its path, or change the RecipeConfig")
    cfg = recipe if isinstance(recipe, RecipeConfig) else load_recipe(recipe, overrides)
    profile = str(hardware_profile) if hardware_profile else cfg.parallel.hardware_profile
    hw = Hardware(gpus, gpus_per_node, gpu, gpu_memory, None, profile)
    if cfg.parallel.plan == "auto":
        no_gpu = (
            "parallel.plan=auto is planned for the GPUs it will run on: no GPU detected here, give "
            + f"{_spell.example('gpus', 'N')} and {_spell.example('gpu', 'NAME')} or "
            + _spell.example("gpu_memory", "SIZE")
        )
        cluster = cluster_of(hw, no_gpu, _spell)
        return _chosen(build_request(None, cfg, hw, spell=_spell, cluster=cluster), "parallel.plan=auto")
    world = gpus or stated_world(cfg)
    if world is None:
        raise ConfigError(
            "the recipe's plan fills the world with parallel.dp_shard (or dp_replicate for ddp): give the job's "
            f"size with {_spell.example('gpus', 'N')}"
        )
    cluster = written_plan_cluster(replace(hw, gpus=world), _spell)
    request = build_request(None, cfg, hw, spell=_spell, cluster=cluster)
    written = resolve_plan(cfg.parallel, world, cfg.train, request.workload.job)
    chosen = [k for k in ("method", "compile", "fp8") if getattr(cfg.train, k) == "auto"]
    if chosen:  # the written plan, with what train.X: auto leaves to the planner chosen as bigtrain train does
        keys = " and ".join(f"train.{k}=auto" for k in chosen)
        return _chosen(replace(request, fixed=written.to_dict()), keys)
    return PlanResult(request, [candidate(request.model, written, cluster, request.workload)])


def _chosen(request: PlanRequest, what: str) -> PlanResult:
    """The search's choice for a recipe's ``auto``, refused as bigtrain train refuses it when nothing fits."""
    result = searched(request, allow_unrunnable=True, show_unrunnable=False)
    if not result.fits:
        best, cluster = result.searched[0], request.cluster
        why = best.rejected_because if best.runnable else f"not runnable yet: {best.unsupported}"
        raise ConfigError(
            f"{what} found no plan that fits {cluster.num_gpus} x {cluster.gpu.name} "
            f"({cluster.gpu.memory_bytes / 2**30:.0f} GiB): best was '{why}'; "
            "run bigtrain plan on the recipe for what would fit"
        )
    return result


def stated_world(cfg: RecipeConfig) -> int | None:
    """The world size a written plan states by itself (every degree given), else None."""
    p = cfg.parallel
    if p.backend == "ddp":
        return None if p.dp_replicate in (None, -1) else p.dp_replicate * p.tp * p.pp * p.cp
    if p.dp_shard in (None, -1):
        return None
    replicate = 1 if p.dp_replicate in (None, -1) else p.dp_replicate
    return replicate * p.dp_shard * p.tp * p.pp * p.cp
