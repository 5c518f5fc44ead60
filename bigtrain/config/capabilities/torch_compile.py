"""``train.compile``: the decoder blocks and the loss through ``torch.compile``."""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, row
from bigtrain.config.setup import Setup


def compile_with_deepspeed(s: Setup) -> str | None:
    if s.train.compile is True and s.plan.backend == "deepspeed":
        return (
            "train.compile=true compiles decoder blocks for the torch-native engines; the deepspeed backend does "
            "not compile them yet: set train.compile=false or use backend fsdp2"
        )
    return None


CAPABILITY = Capability(
    name="compile",
    # a new length would compile again
    one_length=lambda plan, train, hf_config: train.compile is True,
    summary="torch.compile of the decoder blocks and the loss",
    keys=("train.compile",),
    rules=(row(compile_with_deepspeed, "not_built"),),
    transforms=("compile",),
)
