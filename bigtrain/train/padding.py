"""How far a micro-batch of right-padded rows (``data.packing: pad``) is cut: after its longest row, to a multiple of
8 and of what each capability of the plan asks (``Capability.length_multiple``: 16 under FP8; tp under sequence
parallelism), as the HF Trainer's and TRL's collators pad. A plan with a capability that needs every micro-batch of
one length (``Capability.one_length``: a pipeline schedule, context parallelism, compile, a mixture's router loss)
keeps the full ``data.seq_len``."""

from __future__ import annotations

import math
from typing import Any

from bigtrain.config.capabilities import CAPABILITIES
from bigtrain.config.plan import Plan

MULTIPLE = 8  # what kernels like a sequence length to be a multiple of


def trim_multiple(data: Any, plan: Plan, train: Any, hf_config: Any) -> int:
    """The multiple a micro-batch is cut to (``data.loader.RankReader.trim_to``); 0: not cut."""
    if not getattr(data, "padded", False):
        return 0
    if any(c.one_length is not None and c.one_length(plan, train, hf_config) for c in CAPABILITIES):
        return 0
    asked = [c.length_multiple(plan, train) for c in CAPABILITIES if c.length_multiple is not None]
    return math.lcm(MULTIPLE, *asked)
