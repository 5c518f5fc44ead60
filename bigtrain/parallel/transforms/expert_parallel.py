"""Expert parallelism (``parallel.ep``): each block's routed experts split over ep ranks, tokens sent to them by
all-to-all, through transformers' own expert-parallel styles.

transformers ships the layout with each mixture (``base_model_ep_plan``: Mixtral, Qwen2/3-MoE, DeepSeek-V3, OLMoE,
gpt-oss, ...): the fused expert weights (``gate_up_proj``, ``down_proj``) become DTensors sharded on the expert
dimension over the ep mesh (``grouped_gemm``: each rank keeps num_experts / ep whole experts and its experts module
counts only those), and the experts module's forward is replaced (``ep_dispatch_experts``): each (token, expert) pair
is sorted by expert, sent to the rank that owns the expert by an all-to-all, run there through the family's own
experts kernel, sent back by a second all-to-all and weighted by its routing weight on the rank that holds the
token. Both all-to-alls are differentiable, so every expert's gradient sums the contributions of the tokens every
ep rank sent it.

Applied on the meta model before activation checkpointing and FSDP2; the fsdp transform then shards each experts
module over the efsdp ranks (``WorldMesh.expert_fsdp_mesh``) and everything else over dp_shard as before.
"""

from __future__ import annotations

import re

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform


def expert_layout(model: nn.Module) -> dict[str, str]:
    """The model's expert-parallel layout with its wildcards expanded to this model's parameter and module names
    (``model.layers.*.mlp.experts`` -> ``model.layers.1.mlp.experts``: DeepSeek-V3's dense first layers have none)."""
    layout = dict(getattr(model, "ep_plan", None) or {})
    names = [name for name, _ in model.named_modules()] + [name for name, _ in model.named_parameters()]
    expanded = {}
    for pattern, style in layout.items():
        regex = re.compile(re.escape(pattern).replace(r"\*", r"\d+") + "$")
        expanded |= {name: style for name in names if regex.match(name)}
    return expanded


def apply_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh, tp_mesh: DeviceMesh) -> list[nn.Module]:
    """Split ``model``'s experts over ``ep_mesh`` in place (on meta); returns the experts modules (FSDP2 shards
    them on their own mesh). ``tp_mesh``: the ranks that hold the same rows (size 1: bigtrain's ep runs without tp)."""
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    layout = expert_layout(model)
    dispatched = [name for name, style in layout.items() if style == "ep_dispatch_experts"]
    if not dispatched:
        raise RuntimeError(f"the expert-parallel layout of {type(model).__name__} matched none of its modules")
    apply_expert_parallelism(model, ep_mesh, tp_mesh, layout, ep_implementation="all_to_all")
    return [model.get_submodule(name) for name in dispatched]


def _split(built: BuiltModel, ctx: BuildContext) -> None:
    mesh = ctx.mesh
    assert mesh.ep_mesh is not None  # built for plans with ep > 1
    for part in built.parts:
        built.experts.extend(apply_expert_parallel(part, mesh.ep_mesh, mesh.mesh["tp"]))


TRANSFORM = Transform(
    name="expert_parallel",
    wanted=lambda options: options.plan.ep > 1,
    apply=_split,
    planner_terms=("memory_terms.gathered_block_params", "cost.ep_all_to_all_seconds", "cost.estimate_time"),
)
