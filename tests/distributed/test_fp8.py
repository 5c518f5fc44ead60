"""FP8 training (``train.fp8``) equals a plain single-process loop that uses torchao's own float8 linears.

On this CPU torchao emulates the float8 casts and scaled matmuls with the rounding of the real kernels. The reference
converts the same linears the transform's rule converts (every linear of the blocks; the tiny model's widths are all
multiples of 16; not the LM head) with ``convert_to_float8_training`` and runs one forward per row: dynamic scales are
computed per forward (one per tensor under tensorwise scaling), so the reference cuts the batch as the plans do
(micro-batches of one row), and the objective is still the cross-entropy summed over the global batch's labelled
tokens over their count. FSDP2 x 2, tensorwise and rowwise, in the default tier; the others (tests/tiers.py) add 1 rank,
DDP x 2, FSDP2 with its parameters offloaded and hybrid sharding (2 x 2).

Compared: the first FP8_EXACT_STEPS steps' loss and gradient norm within 1e-5 (3 under tensorwise, 1 under rowwise). After them the runs part, by design of
FP8 and not of the plans: measured on tensorwise, steps 1-3 agree within 2e-7 on 1 rank and on FSDP2 x 2 (the float32
sums of another order), then a weight lands on the other side of an e4m3 rounding boundary (one quantum is 6-12% of
the value) and the difference jumps to 1e-5..5e-4 in the loss and 1e-4..5e-3 in the gradient norm, on 1 rank as on
2. Leaving the conversion out of the reference moves the loss far beyond the tolerance within those steps.
Every step (10, each from identical weights, both recipes) is compared on one rank in tests/gpu/test_cpu_twins.py,
and on a GPU with FSDP2's float8 all-gather in tests/gpu/test_cuda_paths.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch.nn.functional as F
from cases import TINY_LLAMA
from helpers import read_metrics, save_tiny_model, with_sections
from shared_launch import SharedLaunches, launch_key, selected
from test_equivalence import RTOL, recipe_for, reference_run
from test_equivalence import data as equivalence_data

data = equivalence_data  # the equivalence test's rows fixture
RECIPES = ("tensorwise", "rowwise")
# before FP8's rounding makes the runs part (module docstring): rowwise scaling, with a scale per row of 16 values,
# parts after the first step on FSDP2 x 2 (gradient norm 1.1e-4 off at step 2); its first step, from identical
# weights, exercises the whole plan (sharded forward, backward, reduction over the ranks, the token normalisation)
FP8_EXACT_STEPS = {"tensorwise": 3, "rowwise": 1}
# each with capabilities no other case pairs with FP8 (tests/pairs.py): selective checkpointing on one rank; every
# other block checkpointed and activation offload on FSDP2 x 2 (with the chunked loss too, the float32 sums of another
# order put a weight across an e4m3 boundary at step 3, as the docstring describes for later steps)
PLANS = {
    "1rank-mb1-accum8-ac-selective": (
        1,
        dict(backend="fsdp2", micro_batch_size=1, activation_checkpointing="selective"),
    ),
    "fsdp2-2ranks-mb1-accum4-ac-every2-offload": (
        2,
        dict(
            backend="fsdp2",
            micro_batch_size=1,
            activation_checkpointing="full",
            checkpoint_every=2,
            offload_activations=True,
        ),
    ),
    # the other tiers (tests/tiers.py) add DDP with each checkpointing and activation offload, FSDP2 with its
    # parameters offloaded, and hybrid sharding
    "ddp-2ranks-mb1-accum4-ac-selective": (
        2,
        dict(backend="ddp", micro_batch_size=1, activation_checkpointing="selective"),
    ),
    "ddp-2ranks-mb1-accum4-ac-full": (2, dict(backend="ddp", micro_batch_size=1, activation_checkpointing="full")),
    "ddp-2ranks-mb1-accum4-ac-every2-offload": (
        2,
        dict(
            backend="ddp",
            micro_batch_size=1,
            activation_checkpointing="full",
            checkpoint_every=2,
            offload_activations=True,
        ),
    ),
    "fsdp2-2ranks-mb1-accum4-offload-params": (2, dict(backend="fsdp2", micro_batch_size=1, offload_params=True)),
    "hsdp-2x2-mb1-accum2": (4, dict(backend="fsdp2", dp_replicate=2, dp_shard=2, micro_batch_size=1)),
}
FULL_ONLY = {name for name in PLANS if name.startswith(("ddp", "hsdp")) or "offload-params" in name}


def fp8_reference(model_dir, rows, recipe: str | None):
    """The plain loop over one forward per row; ``recipe`` None: no float8 (the control)."""

    def objective(model, batch):
        if recipe is not None and not getattr(model, "converted", False):
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)
            convert_to_float8_training(model, config=config, module_filter_fn=lambda m, name: name != "lm_head")
            model.converted = True
        labelled = batch[:, 1:].numel()
        ce = sum(F.cross_entropy(model(input_ids=row[None]).logits[0, :-1], row[1:], reduction="sum") for row in batch)
        return ce / labelled, (ce / labelled).detach()

    return reference_run(model_dir, rows, objective=objective)


@pytest.fixture(scope="module")
def fp8_inputs(data):
    root, rows = data
    model_dir = save_tiny_model(root / "fp8-llama", spec=TINY_LLAMA)
    return model_dir, {recipe: fp8_reference(model_dir, rows, recipe) for recipe in RECIPES}


@pytest.fixture(scope="module")
def fp8_runs(data, fp8_inputs, tmp_path_factory, request):
    """``fp8_runs(name, recipe)``: the launch that trained the case (shared_launch.py: the selected cases of one world
    size, both recipes, in one launch)."""
    root, _ = data
    model_dir, _ = fp8_inputs
    shared = SharedLaunches(tmp_path_factory, "fp8")

    def recipe_of(parallel: dict, fp8: str):
        def make(out):
            raw = recipe_for(model_dir, root / "rows.npy", parallel, out)
            return with_sections(raw, train={**raw["train"], "fp8": fp8})

        return make

    chosen = selected(request.session, "test_fp8_matches_a_loop", "name", "recipe")
    cases = {(n, r): (launch_key(*PLANS[n]), recipe_of(PLANS[n][1], r)) for n, r in chosen}
    return lambda name, recipe: shared.get((name, recipe), cases)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.full) if n in FULL_ONLY else n for n in PLANS])
def test_fp8_matches_a_loop_over_torchao_float8_linears(name, recipe, fp8_inputs, fp8_runs):
    _, references = fp8_inputs
    reference, _ = references[recipe]
    launched = fp8_runs(name, recipe)
    launched.check_finished()
    got = read_metrics(launched.output_dir)
    assert len(got) == len(reference)
    for step, (mine, ref) in enumerate(zip(got[: FP8_EXACT_STEPS[recipe]], reference, strict=False), 1):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=RTOL), f"step {step} loss"
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=RTOL), f"step {step} grad_norm"


def test_leaving_float8_out_of_the_reference_would_be_caught(data, fp8_inputs):
    _, rows = data
    model_dir, references = fp8_inputs
    plain, _ = fp8_reference(model_dir, rows, recipe=None)
    fp8 = references["tensorwise"][0]
    first = zip(plain[: FP8_EXACT_STEPS["tensorwise"]], fp8, strict=False)
    assert max(abs(a["loss"] / b["loss"] - 1) for a, b in first) > 10 * RTOL
