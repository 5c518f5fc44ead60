"""Held-out data, whatever a row is: ``data.eval_path`` read like the training data, else a seeded
``data.eval_fraction`` of it; ``train.eval_every`` needs one of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bigtrain.config.schema import RecipeConfig
from bigtrain.data.sources import held_out_rows
from bigtrain.errors import ConfigError


def with_held_out(cfg: RecipeConfig, data: Any, read: Callable[[str, str], Any], noun: str) -> tuple[Any, Any]:
    """Rows of whole examples and the held-out ones: ``read`` of data.eval_path, else a seeded data.eval_fraction of
    ``data`` (``noun`` names what a row is in the descriptions and errors)."""
    held = None
    if cfg.data.eval_path is not None:
        held = read("data.eval_path", cfg.data.eval_path)
    elif cfg.data.eval_fraction > 0:
        kept, chosen = held_out_rows(data.num_rows, cfg.data.eval_fraction, cfg.train.seed, noun)
        held = data.subset(chosen, f"{len(chosen)} held-out {noun}")
        data = data.subset(kept, f"{data.description}, {len(kept)} for training")
    require_held_out(cfg, held)
    return data, held


def require_held_out(cfg: RecipeConfig, held: Any) -> None:
    if cfg.train.eval_every > 0 and held is None:
        raise ConfigError(
            f"train.eval_every={cfg.train.eval_every} needs held-out data: set data.eval_path or "
            "data.eval_fraction (e.g. 0.05)"
        )
