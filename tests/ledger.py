"""What the suite runs, as plans of jobs: every equivalence case (a plan trained against a plain loop) and every
simulator case (a plan stepped on fake tensors), each with its task and objective, read from the test modules (and the
bench cases they run) that run them, so the ledger cannot drift from them.

``tests/unit/test_every_pair_decided.py`` asks it which pairs of capabilities some case runs together, for each job.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "distributed"))
sys.path.insert(0, str(HERE.parent / "bench"))
LM = "causal-lm/sft"


@dataclass(frozen=True)
class Ran:
    """One plan a test runs: its parallel fields, its train fields, where it runs and its job ("task/objective")."""

    where: str  # "module::case"
    how: str  # "equivalence" (against a plain loop) or "simulator" (one rank on fake tensors)
    parallel: dict[str, Any] = field(hash=False)
    train: dict[str, Any] = field(hash=False, default_factory=dict)
    job: str = LM


def _from(module: str, plans: dict[str, tuple[int, dict[str, Any]]], train: dict[str, Any] | None = None):
    return [
        Ran(f"{module}::{name}", "equivalence", dict(fields), dict(train or {})) for name, (_, fields) in plans.items()
    ]


def _classifier_job(model: str) -> str:
    return (
        "sequence-classification/classification" if model.startswith("bert") else "image-classification/classification"
    )


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
    ran += _from(
        "test_adapters", {k: v for k, v in adapters.items() if "compile" in k}, {"method": "lora", "compile": True}
    )
    ran += _from("test_adapters[qlora]", test_adapters.QLORA_PLANS, {"method": "qlora", "mixed_precision": "bf16"})
    ran += _from("test_context_parallel", test_context_parallel.CP_PLANS)
    for recipe in test_fp8.RECIPES:
        ran += _from(f"test_fp8[{recipe}]", test_fp8.PLANS, {"fp8": recipe})
    ran += _from("test_moe", test_moe.MOE_PLANS, {"router_loss": True})
    ran += _from("test_masked_equivalence", test_masked_equivalence.PLANS)
    return ran + _other_jobs_equivalence()


def _other_jobs_equivalence() -> list[Ran]:
    """The classifiers', the preference objectives', the reward model's, grpo's, the embedding model's, the diffusion
    transformer's and the vision-language models' equivalence cases."""
    import test_classification
    import test_embedding
    import test_grpo
    import test_preference
    import test_reward_model
    import test_text_to_image
    import test_vision_language

    ran = []
    for model, name in test_classification.CASES:
        ending = name.rsplit("-", 1)[-1]
        train = test_classification.TRAIN_OPTIONS.get(ending, {}).get("train", {})
        where = f"test_classification::{model}-{name}"
        ran.append(
            Ran(where, "equivalence", dict(test_classification.PLANS[name][2]), dict(train), _classifier_job(model))
        )
    for name, (objective, method, parallel) in test_preference.CASES.items():
        where = f"test_preference::{name}"
        ran.append(Ran(where, "equivalence", dict(parallel), {"method": method}, f"causal-lm/{objective}"))
    for name, (_, method, parallel) in test_reward_model.CASES.items():
        ran.append(
            Ran(f"test_reward_model::{name}", "equivalence", dict(parallel), {"method": method}, "reward-model/reward")
        )
    for name, (_, method, parallel, _) in test_grpo.CASES.items():
        ran.append(Ran(f"test_grpo::{name}", "equivalence", dict(parallel), {"method": method}, "causal-lm/grpo"))
    for name, (_, parallel, _, method) in test_embedding.CASES.items():
        where = f"test_embedding::{name}"
        ran.append(Ran(where, "equivalence", dict(parallel), {"method": method}, "embedding/contrastive"))
    for name, (_, parallel, method) in test_text_to_image.CASES.items():
        where = f"test_text_to_image::{name}"
        ran.append(Ran(where, "equivalence", dict(parallel), {"method": method}, "text-to-image/flow-matching"))
    for name, (_, _, parallel, train, _) in test_vision_language.CASES.items():
        ran.append(
            Ran(f"test_vision_language::{name}", "equivalence", dict(parallel), dict(train), "image-text-to-text/sft")
        )
    return ran


def _fields(plan: Any) -> dict[str, Any]:
    fields = {k: getattr(plan, k) for k in plan.__dataclass_fields__ if k != "options"}
    fields.update(dict(plan.options))
    return fields


def simulator_cases() -> list[Ran]:
    """The memory cases the suite simulates: a causal LM's (``tests/cases.py``), the preference objectives', the
    classifiers', the reward model's, the embedding model's, the text-to-image model's and the vision-language
    models' (the bench cases their tests run)."""
    from cases import MEMORY_CASES, PIPELINE_MEMORY_CASES, REAL_WIDTH_CASES
    from classifier_memory import CASES as CLASSIFIER_CASES
    from classifier_memory import classifier_plan
    from diffusion_memory import CASES as DIFFUSION_CASES
    from embedding_memory import CASES as EMBEDDING_CASES
    from preference_memory import PREFERENCE_MEMORY_CASES
    from reward_memory import CASES as REWARD_CASES
    from vlm_cases import BENCH_ONLY, VLM_MEMORY_CASES

    ran = []
    for case in [*MEMORY_CASES, *PIPELINE_MEMORY_CASES, *REAL_WIDTH_CASES, *PREFERENCE_MEMORY_CASES]:
        job = f"causal-lm/{getattr(case, 'objective', 'sft')}"
        ran.append(Ran(f"simulator::{case.name}", "simulator", _fields(case.plan()), {"method": case.method}, job))
    for case in CLASSIFIER_CASES:
        plan = classifier_plan(case.backend, case.zero_stage, case.dp, case.micro_batch, case.checkpointed)
        train = {"method": "lora" if case.lora else "full"}
        ran.append(Ran(f"simulator::{case.name}", "simulator", _fields(plan), train, _classifier_job(case.preset)))
    for case in REWARD_CASES:
        plan = classifier_plan(case.backend, case.zero_stage, case.dp, case.micro_batch)
        train = {"method": "lora" if case.lora else "full"}
        ran.append(Ran(f"simulator::{case.name}", "simulator", _fields(plan), train, "reward-model/reward"))
    for case in EMBEDDING_CASES:
        plan = classifier_plan(case.backend, case.zero_stage, case.dp, case.micro_batch)
        train = {"method": "lora" if case.lora else "full"}
        ran.append(Ran(f"simulator::{case.name}", "simulator", _fields(plan), train, "embedding/contrastive"))
    for case in DIFFUSION_CASES:
        plan = classifier_plan(case.backend, case.zero_stage, case.dp, case.micro_batch, case.checkpointed)
        train = {"method": "lora" if case.lora else "full"}
        ran.append(Ran(f"simulator::{case.name}", "simulator", _fields(plan), train, "text-to-image/flow-matching"))
    for case in (c for c in VLM_MEMORY_CASES if c.name not in BENCH_ONLY):
        train = {"method": case.method}
        ran.append(Ran(f"simulator::{case.name}", "simulator", _fields(case.plan()), train, "image-text-to-text/sft"))
    return ran
