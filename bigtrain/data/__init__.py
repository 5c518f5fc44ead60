"""Data: sources (npy, jsonl, txt, built-in), tokenizers, packing and the plan-independent global order."""

from bigtrain.data.order import GlobalOrder
from bigtrain.data.sources import TokenRows, check_data_config, load_token_rows

__all__ = ["GlobalOrder", "TokenRows", "check_data_config", "load_token_rows"]
