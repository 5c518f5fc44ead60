import dataclasses

import pytest

from bigtrain.config.capabilities import Setup, first_problem
from bigtrain.config.plan import Plan
from bigtrain.config.resolve import parallel_of, resolve_plan
from bigtrain.config.schema import ParallelConfig, TrainConfig
from bigtrain.errors import ConfigError


def test_fsdp2_fills_dp_shard():
    plan = resolve_plan(ParallelConfig(), 8, TrainConfig(global_batch_size=16))
    assert (plan.backend, plan.zero_stage, plan.dp_replicate, plan.dp_shard) == ("fsdp2", 3, 1, 8)
    assert plan.grad_accum_steps(16) == 2


def test_hsdp_and_ddp():
    plan = resolve_plan(ParallelConfig(dp_replicate=2), 8, TrainConfig(global_batch_size=8))
    assert (plan.dp_replicate, plan.dp_shard, plan.dp) == (2, 4, 8)
    ddp = resolve_plan(ParallelConfig(backend="ddp", micro_batch_size=2), 4, TrainConfig(global_batch_size=16))
    assert (ddp.zero_stage, ddp.dp_replicate, ddp.dp_shard, ddp.grad_accum_steps(16)) == (0, 4, 1, 2)


def test_grad_reduce_defaults_per_backend():
    fsdp = resolve_plan(ParallelConfig(), 2, TrainConfig(global_batch_size=8))
    assert fsdp.grad_reduce == "every_micro_step"  # sharded gradients between micro-steps
    once = resolve_plan(ParallelConfig(grad_reduce="once_per_step"), 2, TrainConfig(global_batch_size=8))
    assert once.grad_reduce == "once_per_step"
    assert resolve_plan(ParallelConfig(backend="ddp"), 2, TrainConfig(global_batch_size=8)).grad_reduce == "once_per_step"


def test_plan_is_keyword_only():
    with pytest.raises(TypeError):
        Plan("fsdp2", 3, "every_micro_step", 1, 2, 1, 1, "1f1b", "none", 1, False, False)


ONCE = "once_per_step"


def unsupported(plan: Plan) -> str | None:
    """The capability table's first refusal of a plan, before the model is known (what resolution enforces)."""
    problem = first_problem(Setup(plan))
    return None if problem is None else problem.message


def test_the_capability_table_is_what_resolve_plan_enforces():
    ok = resolve_plan(ParallelConfig(), 4, TrainConfig(global_batch_size=8))
    assert unsupported(ok) is None
    assert unsupported(dataclasses.replace(ok, backend="deepspeed", zero_stage=2)) is None  # ZeRO runs
    for change in ({"backend": "deepspeed", "zero_stage": 2, "offload_params": True}, {"offload_optimizer": True}):
        reason = unsupported(dataclasses.replace(ok, **change))
        assert reason is not None and ("needs zero_stage=3" in reason or "needs backend deepspeed" in reason)
    assert unsupported(dataclasses.replace(ok, tp=2, dp_shard=2)) is None  # tensor parallel runs under fsdp2
    ddp_tp = dataclasses.replace(ok, backend="ddp", zero_stage=0, tp=2, dp_shard=1, dp_replicate=2, grad_reduce=ONCE)
    assert "runs with backend fsdp2" in unsupported(ddp_tp)
    assert unsupported(dataclasses.replace(ok, pp=2, dp_shard=2, grad_reduce="once_per_step")) is None
    ddp_pp = dataclasses.replace(ok, backend="ddp", zero_stage=0, pp=2, dp_shard=1, dp_replicate=2, grad_reduce=ONCE)
    assert "parallel.pp=2 runs with backend fsdp2" in unsupported(ddp_pp)


def test_plan_round_trips_into_a_recipe_section():
    plan = resolve_plan(ParallelConfig(zero_stage=2), 2, TrainConfig(global_batch_size=2))
    assert resolve_plan(parallel_of(plan.to_dict()), 2, TrainConfig(global_batch_size=2)) == plan


def test_a_plan_json_reads_back_into_the_same_plan_with_its_record_options():
    # plan.json writes the records' options flat among the plan's keys (to_dict); bench/rank0_on_device.py read them
    # back with Plan(**keys) and failed on the first record option (seen on an H100: channels_last)
    plan = resolve_plan(ParallelConfig(zero_stage=2), 2, TrainConfig(global_batch_size=2))
    assert dict(plan.options)  # the records' options are there to lose
    assert Plan.from_dict(plan.to_dict()) == plan


@pytest.mark.parametrize(
    "cfg, world, batch, expected",
    [
        (
            ParallelConfig(dp_shard=2, dp_replicate=2),
            2,
            8,
            "dp_replicate=2 x dp_shard=2 x tp=1 x pp=1 = 4 do not match the world size 2",
        ),
        (
            ParallelConfig(micro_batch_size=2),
            4,
            10,
            "train.global_batch_size=10 is not a multiple of parallel.micro_batch_size=2 x data-parallel degree 4 = 8; "
            "try 8 or 16",
        ),
        (ParallelConfig(backend="ddp", tp=2), 2, 8, "parallel.tp=2 runs with backend fsdp2"),
        (
            ParallelConfig(backend="deepspeed", zero_stage=2, offload_params=True),
            2,
            8,
            "parallel.offload_params=true with backend deepspeed needs zero_stage=3",
        ),
        (ParallelConfig(backend="fsdp2", offload_optimizer=True), 2, 8, "use offload_params=true"),
        (ParallelConfig(zero_stage=1), 2, 8, "parallel.zero_stage=1 is not a mode of backend fsdp2; use 3"),
        (
            ParallelConfig(backend="ddp", grad_reduce="every_micro_step"),
            2,
            8,
            "parallel.grad_reduce=every_micro_step is not a mode of backend ddp, which reduces once_per_step",
        ),
        (ParallelConfig(backend="ddp", pp=2), 2, 8, "parallel.pp=2 runs with backend fsdp2"),
        (
            ParallelConfig(pp=2, grad_reduce="every_micro_step"),
            2,
            8,
            "parallel.grad_reduce=every_micro_step is not possible with parallel.pp=2",
        ),
        (ParallelConfig(checkpoint_every=0), 2, 8, "parallel.checkpoint_every=0 must be at least 1"),
        (ParallelConfig(backend="ddp", dp_shard=2), 2, 8, "parallel.dp_shard=2 shards parameters"),
        (ParallelConfig(dp_replicate=3), 4, 8, "parallel.dp_replicate=3 does not divide the data-parallel world 4"),
        (ParallelConfig(plan="auto"), 2, 8, "parallel.plan=auto is chosen at start-up by the trainer"),
        (ParallelConfig(micro_batch_size=0), 2, 8, "parallel.micro_batch_size=0 must be at least 1"),
        (
            ParallelConfig(loss_parallel=True),
            2,
            8,
            "parallel.loss_parallel=true shards the logits over the tp ranks; it needs parallel.tp > 1",
        ),
        (
            ParallelConfig(loss_parallel=True, tp=2, pp=2),
            4,
            8,
            "parallel.loss_parallel=true is not supported with parallel.pp > 1 yet",
        ),
        (
            ParallelConfig(sequence_parallel=True),
            2,
            8,
            "parallel.sequence_parallel=true splits the sequence over the tp ranks; it needs parallel.tp > 1",
        ),
        (
            ParallelConfig(sequence_parallel=True, tp=2, pp=2),
            4,
            8,
            "parallel.sequence_parallel=true is not supported with parallel.pp > 1 yet",
        ),
    ],
)
def test_bad_plans(cfg, world, batch, expected):
    with pytest.raises(ConfigError) as e:
        resolve_plan(cfg, world, TrainConfig(global_batch_size=batch))
    assert expected in str(e.value)
