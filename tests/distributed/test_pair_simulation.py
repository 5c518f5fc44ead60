"""What no equivalence case runs together, stepped by the simulator: bigtrain's own step for rank 0 of the job on
fake tensors (``bigtrain/measure/simulate.py``), a few plans per job that each hold many of those pairs
(``tests/pairs.py``'s covering plans), on the job's example model (a Llama, a ResNet, a BERT, a LLaVA). A combination
that fails to build or step fails here."""

from __future__ import annotations

import pytest
from pairs import all_covering_plans, combined, workload_of

from bigtrain.measure.simulate import simulate

pytestmark = pytest.mark.full
PLANS = all_covering_plans()


def _id(job, engine: str, features) -> str:
    names = "+".join(f.name.split(" (")[0].split(":")[-1].strip(" `+") for f in features)
    return f"{job.name}:{engine}:{names}"


def test_the_covering_plans_exist():
    assert len({job.name for job, _, _ in PLANS}) >= 5  # the jobs' pairs left after their equivalence and memory cases


# the preference objectives beyond dpo step the same engine paths as dpo's covering plans (their losses differ, and
# their numerics are checked against the papers' formulas on real ranks): CI steps dpo's, the extended tier the rest
SAME_PATHS_AS_DPO = ("ipo", "orpo", "simpo")
CASES = [
    pytest.param(*p, id=_id(*p), marks=pytest.mark.extended if p[0].job.objective in SAME_PATHS_AS_DPO else ())
    for p in PLANS
]


@pytest.mark.parametrize("job,engine,features", CASES)
def test_the_plan_steps_on_fake_tensors(job, engine, features):
    plan, train = combined(engine, features, job)
    peak = simulate(job.model, plan, workload_of(job, train))
    assert peak["Total"] > 0 and peak["Total"] >= peak.get("Parameter", 0)
