"""``train.compile``: ``torch.compile`` each decoder block, in place, and the loss (``losses/causal_lm.py``).

After tensor parallelism and activation checkpointing and before FSDP2 (torchtitan's order): the compiled region is
the block with its recompute wrapper, and FSDP2's hooks stay outside it. ``Module.compile`` compiles in place, so
parameter names (and checkpoints) keep no ``_orig_mod`` prefix. The first steps pay the compilation. The planner
prices it (``cost.py``: COMPILED_*; ``memory_terms.py``: COMPILED_ACTIVATION_SHARE, COMPILED_LOGIT_BYTES, fitted to
H100 runs), and with ``train.compile: auto`` chooses it where it predicts a faster step; the capability table refuses
it where the engine does not run it (DeepSpeed).
"""

from __future__ import annotations

from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform


def _compile_blocks(built: BuiltModel, ctx: BuildContext) -> None:
    for part in range(len(built.parts)):
        for block in built.blocks(part):
            block.compile()
    built.compile_loss = True


TRANSFORM = Transform(
    name="compile",
    wanted=lambda options: options.compile,
    apply=_compile_blocks,
    # measured on one GPU (bench/results/side_by_side_h100.md, rank0_h200.md) and modelled from those runs
    planner_terms=("memory_terms.compiled_activation_bytes", "cost.memory_bound_bytes"),
)
