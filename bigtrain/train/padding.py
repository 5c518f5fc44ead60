"""How far a micro-batch of right-padded rows (``data.packing: pad``) is cut: after its longest row, to a multiple
of 8 (16 under FP8, whose matmuls want dimensions divisible by 16; times tp under sequence parallelism, which splits
the sequence over the tp ranks), as the HF Trainer's and TRL's collators pad. A plan that needs every micro-batch of
one length keeps the full ``data.seq_len``: a pipeline schedule (its stages' shapes are fixed at the first step),
context parallelism (each row split in equal slices), a compiled model (a new length would recompile) and a
mixture's router loss (a mean over the forward's tokens, padding included, as transformers computes it)."""

from __future__ import annotations

import math
from typing import Any

from bigtrain.config.plan import Plan
from bigtrain.losses.causal_lm import router_loss_coef


def trim_multiple(data: Any, plan: Plan, train: Any, hf_config: Any) -> int:
    """The multiple a micro-batch is cut to (``data.loader.RankReader.trim_to``); 0: not cut."""
    if not getattr(data, "padded", False):
        return 0
    if plan.pp > 1 or plan.cp > 1 or train.compile is True or router_loss_coef(hf_config):
        return 0
    multiple = 16 if train.fp8 not in ("none", "auto") else 8
    return math.lcm(multiple, plan.tp) if plan.sequence_parallel else multiple
