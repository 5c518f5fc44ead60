"""Data: sources (npy, jsonl, txt, built-in), tokenizers, packing, the plan-independent global order, and the
per-rank loader."""

from bigtrain.data.loader import StepBatch, StepLoader
from bigtrain.data.order import GlobalOrder
from bigtrain.data.sources import TokenRows, check_data_config, check_vocabulary, load_token_rows

__all__ = [
    "GlobalOrder",
    "StepBatch",
    "StepLoader",
    "TokenRows",
    "check_data_config",
    "check_vocabulary",
    "load_token_rows",
]
