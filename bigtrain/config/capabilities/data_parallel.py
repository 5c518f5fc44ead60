"""Data parallelism: the backend (DDP, FSDP2, DeepSpeed ZeRO), its sharding stage, replicas x shards (HSDP), the
offload of parameters and optimizer states, how gradients are reduced during accumulation, and the micro-batch."""

from __future__ import annotations

from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.capabilities.table import Capability, Plan, SearchSpace, row
from bigtrain.config.plan import CHOOSES_GRAD_REDUCE, DEFAULT_GRAD_REDUCE, ZERO_STAGES, multiples_hint
from bigtrain.config.schema import GRAD_REDUCE
from bigtrain.config.setup import Setup


def _zero_stage_of_backend(s: Setup) -> str | None:
    p = s.plan
    if p.zero_stage in ZERO_STAGES[p.backend]:
        return None
    meaning = {
        "ddp": "ddp replicates everything: unset it or use 0",
        "fsdp2": "use 3 (reshard after forward) or 2 (keep parameters unsharded until backward ends)",
        "deepspeed": "use 1, 2 or 3",
    }[p.backend]
    return f"parallel.zero_stage={p.zero_stage} is not a mode of backend {p.backend}; {meaning}"


def _ddp_does_not_shard(s: Setup) -> str | None:
    if s.plan.backend == "ddp" and s.plan.dp_shard > 1:
        return (
            f"parallel.dp_shard={s.plan.dp_shard} shards parameters, which backend ddp does not do; unset it (ddp "
            "replicates over parallel.dp_replicate) or use backend fsdp2"
        )
    return None


def _hybrid_sharding_is_fsdp2(s: Setup) -> str | None:
    # replica groups that synchronise every H steps are another matter: replica_sync's rows say what runs
    if s.plan.backend == "deepspeed" and s.plan.dp_replicate > 1 and not settings_of(s.plan).semi_synchronous:
        return (
            f"parallel.dp_replicate={s.plan.dp_replicate} (hybrid sharding) is an fsdp2 layout; deepspeed shards over "
            "the whole data-parallel world: unset it"
        )
    return None


def _offload_params_needs_sharding(s: Setup) -> str | None:
    if s.plan.offload_params and s.plan.backend == "ddp":
        return "parallel.offload_params=true needs a sharded backend; use backend fsdp2"
    return None


def _offload_optimizer_needs_deepspeed(s: Setup) -> str | None:
    p = s.plan
    if not p.offload_optimizer or p.backend == "deepspeed":
        return None
    if p.backend == "fsdp2":
        return (
            "parallel.offload_optimizer=true needs backend deepspeed (ZeRO-Offload); backend fsdp2 offloads "
            "parameters with their optimizer states: use offload_params=true"
        )
    return f"parallel.offload_optimizer=true needs backend deepspeed (ZeRO-Offload), not {p.backend}"


def _deepspeed_offloads_parameters_in_zero3(s: Setup) -> str | None:
    p = s.plan
    if p.backend == "deepspeed" and p.offload_params and p.zero_stage != 3:
        return (
            f"parallel.offload_params=true with backend deepspeed needs zero_stage=3 (ZeRO-3 offload_param), not "
            f"{p.zero_stage}; or offload only the optimizer (offload_optimizer=true)"
        )
    return None


def _grad_reduce_of_backend(s: Setup) -> str | None:
    p = s.plan
    default = DEFAULT_GRAD_REDUCE[p.backend]
    if p.pp == 1 and p.backend not in CHOOSES_GRAD_REDUCE and p.grad_reduce != default:
        return (
            f"parallel.grad_reduce={p.grad_reduce} is not a mode of backend {p.backend}, which reduces {default}: "
            "unset it"
        )
    return None


def _batch_splits_into_micro_batches(s: Setup) -> str | None:
    p, batch = s.plan, s.train.global_batch_size
    unit = p.micro_batch_size * p.dp
    if batch < 1 or batch % unit:
        return (
            f"train.global_batch_size={batch} is not a multiple of parallel.micro_batch_size={p.micro_batch_size} x "
            f"data-parallel degree {p.dp} = {unit}; try {multiples_hint(unit, batch)}"
        )
    return None


def _reduce_modes(plans: list[Plan], space: SearchSpace) -> list[Plan]:
    """Every gradient-reduction mode the rows allow where the mode can matter (several micro-batches or pipeline
    stages), the plan's own first; decided once per layout."""

    def allowed(plan: Plan) -> list[str]:
        modes = [plan.grad_reduce] + [m for m in GRAD_REDUCE if m != plan.grad_reduce]
        return [m for m in modes if not space.contradicts(plan.but(grad_reduce=m))]

    out = []
    for plan in plans:
        if plan.pp == 1 and plan.grad_accum_steps(space.global_batch_size) == 1:
            out.append(plan)
            continue
        modes = space.per_layout("grad_reduce", plan, allowed)
        out += [plan if mode == plan.grad_reduce else plan.but(grad_reduce=mode) for mode in modes]
    return out


CAPABILITY = Capability(
    name="data_parallel",
    summary="DDP, FSDP2 (ZeRO-2/3, HSDP) and DeepSpeed ZeRO-1/2/3; parameter and optimizer offload; gradient "
    "reduction every micro-step or once per step",
    keys=(
        "parallel.backend",
        "parallel.zero_stage",
        "parallel.dp_replicate",
        "parallel.dp_shard",
        "parallel.grad_reduce",
        "parallel.micro_batch_size",
        "parallel.offload_params",
        "parallel.offload_optimizer",
    ),
    rules=(
        row(_zero_stage_of_backend, "invalid"),
        row(_ddp_does_not_shard, "invalid"),
        row(_hybrid_sharding_is_fsdp2, "invalid"),
        row(_offload_params_needs_sharding, "invalid"),
        row(_deepspeed_offloads_parameters_in_zero3, "invalid"),
        row(_offload_optimizer_needs_deepspeed, "invalid"),
        row(_grad_reduce_of_backend, "invalid"),
        row(_batch_splits_into_micro_batches, "fit", reads_micro_batch=True),
    ),
    variants=_reduce_modes,
    transforms=("fsdp", "ddp"),
)
