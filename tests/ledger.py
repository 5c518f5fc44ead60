"""What the suite runs, as plans: every equivalence case (a plan trained against a plain loop) and every simulator case
(a plan stepped on fake tensors), read from the test modules that run them, so the ledger cannot drift from them.

``tests/unit/test_every_pair_decided.py`` asks it which pairs of capabilities some case runs together.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "distributed"))


@dataclass(frozen=True)
class Ran:
    """One plan a test runs: its parallel fields, its train fields, and where it runs."""

    where: str  # "module::case"
    how: str  # "equivalence" (against a plain loop) or "simulator" (one rank on fake tensors)
    parallel: dict[str, Any] = field(hash=False)
    train: dict[str, Any] = field(hash=False, default_factory=dict)


def _from(module: str, plans: dict[str, tuple[int, dict[str, Any]]], train: dict[str, Any] | None = None):
    return [Ran(f"{module}::{name}", "equivalence", dict(fields), dict(train or {})) for name, (_, fields) in plans.items()]


def equivalence_cases() -> list[Ran]:
    import test_adapters
    import test_context_parallel
    import test_equivalence
    import test_fp8
    import test_masked_equivalence
    import test_moe

    ran = _from("test_equivalence", test_equivalence.PLANS)
    adapters = test_adapters.ADAPTER_PLANS
    ran += _from("test_adapters", {k: v for k, v in adapters.items() if "compile" not in k}, {"method": "lora"})
    ran += _from("test_adapters", {k: v for k, v in adapters.items() if "compile" in k}, {"method": "lora", "compile": True})
    ran += _from("test_adapters[qlora]", test_adapters.QLORA_PLANS, {"method": "qlora", "mixed_precision": "bf16"})
    ran += _from("test_context_parallel", test_context_parallel.CP_PLANS)
    for recipe in test_fp8.RECIPES:
        ran += _from(f"test_fp8[{recipe}]", test_fp8.PLANS, {"fp8": recipe})
    ran += _from("test_moe", test_moe.MOE_PLANS, {"router_loss": True})
    ran += _from("test_masked_equivalence", test_masked_equivalence.PLANS)
    return ran


def simulator_cases() -> list[Ran]:
    from cases import MEMORY_CASES, PIPELINE_MEMORY_CASES, REAL_WIDTH_CASES

    ran = []
    for case in [*MEMORY_CASES, *PIPELINE_MEMORY_CASES, *REAL_WIDTH_CASES]:
        plan = case.plan()
        fields = {k: getattr(plan, k) for k in plan.__dataclass_fields__ if k != "options"}
        fields.update(dict(plan.options))
        ran.append(Ran(f"simulator::{case.name}", "simulator", fields, {"method": case.method}))
    return ran
