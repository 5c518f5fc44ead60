"""``train.compile``: ``torch.compile`` each decoder block, in place, and the loss (``engine/loss.py``).

After tensor parallelism and activation checkpointing and before FSDP2 (torchtitan's order): the compiled region is
the block with its recompute wrapper, and FSDP2's hooks stay outside it. ``Module.compile`` compiles in place, so
parameter names (and checkpoints) keep no ``_orig_mod`` prefix. The first steps pay the compilation. The planner
does not model compile's memory and time yet; the capability table refuses it where the engine does not run it
(DeepSpeed), and ``plan: auto`` sees the option, so it never picks such a plan.
"""

from __future__ import annotations

from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform


def _compile_blocks(built: BuiltModel, ctx: BuildContext) -> None:
    for part in range(len(built.parts)):
        for block in built.blocks(part):
            block.compile()
    built.compile_loss = True


TRANSFORM = Transform(name="compile", wanted=lambda options: options.compile, apply=_compile_blocks)
