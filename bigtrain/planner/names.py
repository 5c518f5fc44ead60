"""A plan's one-line name, as the plan table, the plan line at start-up and the checkpoints' logs print it (imported
without the search: ``bigtrain train`` with a written plan names its plan and never searches)."""

from __future__ import annotations

from bigtrain.config.capabilities import OPTIONS
from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.plan import Plan


def describe(plan: Plan) -> str:
    """A compact one-line name for a plan, e.g. 'fsdp2 zero3 dp=2x4 tp=2 pp=1 ac=full mb=2 rs=micro'.

    ``tp=2+lp``: with loss_parallel (LM head and logits split over the vocabulary too); ``+sp``: with
    sequence_parallel (norms and residual stream split over the sequence). ``rs=micro``: fsdp2
    reduce-scatters gradients after every micro-step (sharded between them); ``rs=step``: once per optimizer step
    (unsharded in between). Shown for fsdp2 only: ddp and deepspeed have one mode each. ``chunk=4096``: the LM head
    and loss over chunks of that many tokens (parallel.loss_chunk_tokens); ``cp=2``: context parallelism; ``ep=2``:
    expert parallelism; ``ac=full/2``: every other block checkpointed (parallel.checkpoint_every); ``offload=act``:
    the blocks' saved activations wait in host memory (parallel.offload_activations).
    """
    dp = f"{plan.dp_replicate}x{plan.dp_shard}" if plan.backend == "fsdp2" and plan.dp_replicate > 1 else f"{plan.dp}"
    parts = [plan.backend if plan.backend == "ddp" else f"{plan.backend} zero{plan.zero_stage}", f"dp={dp}"]
    tp = f"tp={plan.tp}" + ("+lp" if plan.loss_parallel else "") + ("+sp" if plan.sequence_parallel else "")
    parts += [tp, f"pp={plan.pp}"]
    parts[-1] += f"/{plan.pp_schedule}" if plan.pp > 1 else ""
    parts += ([f"cp={plan.cp}"] if plan.cp > 1 else []) + ([f"ep={plan.ep}"] if plan.ep > 1 else [])
    every = f"/{plan.checkpoint_every}" if plan.checkpoint_every > 1 and plan.activation_checkpointing != "none" else ""
    parts += [f"ac={plan.activation_checkpointing}{every}", f"mb={plan.micro_batch_size}"]
    if plan.backend == "fsdp2":
        parts.append("rs=micro" if plan.grad_reduce == "every_micro_step" else "rs=step")
    if plan.loss_chunk_tokens:
        parts.append(f"chunk={plan.loss_chunk_tokens}")
    if plan.offload_params:
        parts.append("offload=params")
    if plan.offload_optimizer:
        parts.append("offload=optimizer")
    if plan.offload_activations:
        parts.append("offload=act")
    sync = settings_of(plan)
    if sync.semi_synchronous:  # its period always, its streaming where it streams
        streamed = f" F={sync.fragments}/tau={sync.delay}" if sync.fragments > 1 else ""
        parts.append(f"{sync.mode} H={sync.every}{streamed}")
    parts += [
        f"{name}={value}"
        for name, value in plan.options
        if value != OPTIONS[name].default and (name not in SYNC_SHOWN or not sync.semi_synchronous)
    ]
    return " ".join(parts)


# the replica_sync options the ``diloco H=100 F=4/tau=5`` part of a name says
SYNC_SHOWN = ("sync", "sync_every", "fragments", "fragment_delay")
