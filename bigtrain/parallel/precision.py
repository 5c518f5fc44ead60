"""The compute dtype of each ``train.mixed_precision`` choice (None: compute in the fp32 of the weights)."""

from __future__ import annotations

import torch

from bigtrain.config.schema import PRECISIONS

COMPUTE_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
assert set(COMPUTE_DTYPES) == set(PRECISIONS), "every precision of the schema needs a compute dtype"
