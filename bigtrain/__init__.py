"""bigtrain: one trainer for sharded, tensor- and pipeline-parallel training of HuggingFace causal LMs, and a
planner that chooses the plan.

The public Python API (``bigtrain.plan``, ``bigtrain.recipe_plan``, ``PlanResult``, ``MemoryCheckCallback``,
``check_memory``) lives in ``bigtrain.api`` and is loaded on first use, so ``import bigtrain`` (and the command line)
stays light. docs/api.md shows it inside HF Trainer, TRL and accelerate scripts.
"""

from typing import Any

__version__ = "0.1.0"

from bigtrain.api import __all__ as _api_names  # a name table only: bigtrain.api loads each name on first use

__all__ = [*_api_names, "__version__"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from bigtrain import api

        return getattr(api, name)
    raise AttributeError(f"module 'bigtrain' has no attribute {name!r}")
