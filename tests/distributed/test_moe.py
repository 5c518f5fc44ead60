"""Mixture-of-experts training with the router's load-balancing loss (Mixtral with ``output_router_logits`` and
``router_aux_loss_coef``): FSDP2 x 2 with accumulation and DeepSpeed ZeRO-3 x 2 equal a single-process loop over the
same micro-batches (loss and gradient norm 1e-5 per step over 10 steps, parameters 2e-5), and so does expert
parallelism (ep=2 x efsdp=2 on 4 ranks).

The objective, as ``losses/causal_lm.router_loss`` states it: the cross-entropy summed over the global batch's labelled
tokens and divided by their count, plus ``coef`` times the mean of the per-forward router loss over every forward of
the global batch. The router loss is not additive over tokens, so a loop of one forward per global batch is another
objective; the reference runs one forward per micro-batch of one row, as the plans below do (micro_batch_size 1). The
check has teeth: leaving the router loss out moves the first gradient norm far beyond the tolerance."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cases import ROUTED_MIXTRAL
from helpers import learnable_rows, save_rows, save_tiny_model
from test_equivalence import NUM_ROWS, RTOL, SEQ_LEN, STEPS, assert_plan_matches, reference_run

MOE_PLANS = {
    "fsdp2-2ranks-mb1-accum4": (2, dict(backend="fsdp2", micro_batch_size=1)),
    "deepspeed-zero3-2ranks-mb1-accum4": (2, dict(backend="deepspeed", zero_stage=3, micro_batch_size=1)),
    # expert parallelism: the 4 experts split over 2 ranks (tokens exchanged by all-to-all), each expert sharded by
    # FSDP2 over the 2 ranks that hold it (ep=2 x efsdp=2); ep=2 on 2 ranks: test_equivalence.py's EP_PLANS
    # with capabilities no other case pairs with ep (tests/pairs.py): every other block checkpointed, the chunked
    # loss and activation offload
    "fsdp2-ep2-dp_shard4-4ranks-mb1-accum2-ac-every2-chunked-loss-offload": (
        4,
        dict(
            backend="fsdp2",
            micro_batch_size=1,
            ep=2,
            activation_checkpointing="full",
            checkpoint_every=2,
            loss_chunk_tokens=7,
            offload_activations=True,
        ),
    ),
}


def routed_reference(model_dir, rows, coef: float, steps: int = STEPS):
    """The plain loop with one forward per row (the plans' micro-batches) and the objective of the module
    docstring."""

    def objective(model, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        labelled = batch[:, 1:].numel()
        forwards = [model(input_ids=row[None]) for row in batch]
        ce = sum(
            F.cross_entropy(f.logits[0, :-1], row[1:], reduction="sum") for f, row in zip(forwards, batch, strict=True)
        )
        router = sum(f.aux_loss for f in forwards) / len(forwards)
        return ce / labelled + coef * router, (ce / labelled).detach()

    return reference_run(model_dir, rows, objective=objective, steps=steps)


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    rows = learnable_rows(NUM_ROWS, SEQ_LEN)
    save_rows(root / "rows.npy", rows)
    model_dir = save_tiny_model(root / "mixtral", spec=ROUTED_MIXTRAL)
    return root / "rows.npy", rows, model_dir, *routed_reference(model_dir, rows, ROUTED_MIXTRAL["router_aux_loss_coef"])


# the full tier (or the extended one: tests/tiers.py) adds DeepSpeed ZeRO-3 (the router loss under DeepSpeed's own
# backward)
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.full) if n.startswith("deepspeed") else n for n in MOE_PLANS]
)
def test_moe_with_its_router_loss_matches_the_single_process_loop(name, routed, tmp_path):
    rows_path, _, model_dir, reference, reference_params = routed
    nproc, parallel = MOE_PLANS[name]
    assert_plan_matches(model_dir, rows_path, nproc, parallel, reference, reference_params, tmp_path)


def test_leaving_the_router_loss_out_would_be_caught(routed):
    _, rows, model_dir, reference, _ = routed
    without, _ = routed_reference(model_dir, rows, coef=0.0, steps=1)
    assert abs(without[0]["grad_norm"] / reference[0]["grad_norm"] - 1) > 10 * RTOL


def _ep_worker(rank: int, port: int, model_dir: str, results) -> None:
    """One of 4 ranks of an ep=2 x efsdp=2 plan: what it holds of each experts weight, and the whole weight."""
    import os

    import torch.distributed as dist
    from helpers import recipe_engine
    from transformers import AutoModelForCausalLM

    from bigtrain.config.load import load_recipe
    from bigtrain.runtime import init_process_group, read_launch_env

    os.environ.update(RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cfg = load_recipe(None, [f"model.name_or_path={model_dir}", "parallel.ep=2", "train.global_batch_size=4"])
    init_process_group(read_launch_env(), torch.device("cpu"), timeout_s=60)
    try:
        engine, _ = recipe_engine(cfg, world=4)
        model = engine.built.parts[0]
        want = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
        held = {}
        for name, param in model.named_parameters():
            if ".experts." in name:
                whole = param.full_tensor()
                held[name] = (tuple(param.to_local().shape), tuple(whole.shape), torch.equal(whole, want[name]))
        results.put((rank, held))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.full
def test_ep_splits_the_experts_and_fsdp2_shards_each_one(tmp_path):
    """4 ranks, ep=2: each rank computes with 2 of the 4 experts, FSDP2 shards those 2 over the 2 ranks that hold
    them (a quarter of each fused weight per rank), and the whole weight is the pretrained one."""
    import torch.multiprocessing as mp
    from helpers import free_port

    model_dir = save_tiny_model(tmp_path / "mixtral", spec=ROUTED_MIXTRAL)
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_ep_worker, args=(free_port(), str(model_dir), results), nprocs=4, start_method="spawn")
    got = dict(results.get() for _ in range(4))
    assert sorted(got) == [0, 1, 2, 3]
    for held in got.values():
        assert held and all(matches for _, _, matches in held.values())
        for local, whole, _ in held.values():
            assert whole[0] == ROUTED_MIXTRAL["num_local_experts"]
            assert torch.Size(local).numel() * 4 == torch.Size(whole).numel()


@pytest.mark.full
def test_an_ep_checkpoint_resumes_without_ep_and_exports_the_family_s_format(tmp_path):
    """A 2-rank ep=2 run's checkpoint (experts as DTensors on the ep mesh) resumes on plain FSDP2 x 2 and continues
    as the uninterrupted ep run does; its final export loads with from_pretrained (per-expert tensors on disk)."""
    from helpers import recipe_dict, run_torchrun, save_rows, write_recipe
    from test_checkpoint_resume import RESHARD_RTOL, compare, final_weights, resume
    from transformers import AutoModelForCausalLM

    save_rows(tmp_path / "rows.npy", learnable=True)
    model_dir = save_tiny_model(tmp_path / "mixtral", spec=ROUTED_MIXTRAL)
    raw = recipe_dict(
        tmp_path / "straight",
        tmp_path / "rows.npy",
        model_dir,
        data={"shuffle": True},
        train={"steps": 4, "global_batch_size": 8, "lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.5, "seed": 3},
        parallel={"backend": "fsdp2", "micro_batch_size": 2, "ep": 2},
        checkpoint={"every": 2, "keep": 5},
    )
    recipe_path = write_recipe(tmp_path / "recipe.yaml", raw)
    proc = run_torchrun(["train", str(recipe_path)], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    straight = tmp_path / "straight"
    resume(recipe_path, straight / "checkpoints" / "step_2", tmp_path / "resumed", 2, "parallel.ep=1")
    compare(tmp_path / "resumed", straight, RESHARD_RTOL)
    mine, theirs = final_weights(tmp_path / "resumed"), final_weights(straight)
    assert set(mine) == set(theirs) and any(".experts.0." in name for name in theirs)  # Mixtral's on-disk layout
    for name, value in theirs.items():
        torch.testing.assert_close(mine[name], value, rtol=1e-4, atol=1e-6, msg=name)
    AutoModelForCausalLM.from_pretrained(straight / "model")
