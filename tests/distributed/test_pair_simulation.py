"""The pairs of capabilities no equivalence case runs together, stepped by the simulator: bigtrain's own step for
rank 0 of the job on fake tensors (``bigtrain/measure/simulate.py``), a few plans that each hold many of those pairs
(``tests/pairs.py``'s covering plans). A combination that fails to build or step fails here."""

from __future__ import annotations

import pytest
from pairs import GEN, all_covering_plans, combined

from bigtrain.config.workload import Workload
from bigtrain.measure.simulate import simulate

pytestmark = pytest.mark.full
PLANS = all_covering_plans()


def _id(engine: str, features) -> str:
    return engine + ":" + "+".join(f.name.split(" (")[0].split(":")[-1].strip(" `+") for f in features)


def test_the_covering_plans_exist():
    assert len(PLANS) >= 5  # the pairs left after the equivalence and memory cases, on DDP and FSDP2


@pytest.mark.parametrize("engine,features", PLANS, ids=[_id(e, f) for e, f in PLANS])
def test_the_plan_steps_on_fake_tensors(engine, features):
    plan, train = combined(engine, features)
    workload = Workload(seq_len=32, global_batch_size=8, method=train.method, mixed_precision=train.mixed_precision)
    peak = simulate(GEN.MODEL, plan, workload)
    assert peak["Total"] > 0 and peak["Total"] >= peak.get("Parameter", 0)
