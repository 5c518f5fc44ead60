"""``train.fp8``: float8 matmuls in the decoder blocks' linears (torchao), tensorwise or rowwise scaling."""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, row
from bigtrain.config.schema import ADAPTER_METHODS
from bigtrain.config.setup import Setup


def fp8_with_deepspeed(s: Setup) -> str | None:
    if s.train.fp8 not in ("none", "auto") and s.plan.backend == "deepspeed":
        return (
            f"train.fp8={s.train.fp8} converts the blocks' linears for the torch-native engines; the deepspeed "
            "backend does not run them yet: set train.fp8=none or use backend fsdp2"
        )
    return None


def fp8_with_tp_or_pp(s: Setup) -> str | None:
    p = s.plan
    if s.train.fp8 in ("none", "auto") or (p.tp == 1 and p.pp == 1):
        return None
    degree = f"parallel.tp={p.tp}" if p.tp > 1 else f"parallel.pp={p.pp}"
    return f"train.fp8={s.train.fp8} with {degree} is not built yet: set train.fp8=none or that degree to 1"


def fp8_with_adapters(s: Setup) -> str | None:
    if s.train.fp8 not in ("none", "auto") and s.train.method in ADAPTER_METHODS:
        return (
            f"train.fp8={s.train.fp8} with train.method={s.train.method} is not built yet (the frozen base would be "
            "cast to FP8 in every step); set train.fp8=none"
        )
    return None


CAPABILITY = Capability(
    name="fp8",
    # FP8 matmuls want dimensions divisible by 16
    length_multiple=lambda plan, train: 16 if train.fp8 not in ("none", "auto") else 1,
    summary="FP8 linears (torchao float8 training, tensorwise or rowwise), FP8 all-gather under FSDP2",
    keys=("train.fp8",),
    rules=(
        row(fp8_with_deepspeed, "not_built"),
        row(fp8_with_tp_or_pp, "not_built"),
        row(fp8_with_adapters, "not_built"),
    ),
    transforms=("float8",),
)
