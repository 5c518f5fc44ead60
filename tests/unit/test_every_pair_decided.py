"""Every capability and every pair of capabilities, on every engine, for every job (task and objective), is decided:
refused by a row of the table with the job's own model facts, run by an equivalence case of that job, or stepped by
the simulator (``tests/pairs.py`` says how each is decided). What nothing decides yet is listed in
``tests/undecided_pairs.txt``: the list may only shrink, and a capability, task or objective that adds an undecided
pair fails here until a row, a case or the simulator decides it (or the list names it, in review's sight)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, when run as a script to rewrite the list
from helpers import REPO  # noqa: E402
from ledger import Ran  # noqa: E402
from pairs import FEATURES, JOBS, NONE, Feature, decisions, holds, pairs  # noqa: E402

UNDECIDED = REPO / "tests" / "undecided_pairs.txt"


def listed() -> set[tuple[str, str, str, str]]:
    rows = [line.split(" | ") for line in UNDECIDED.read_text().splitlines() if line and not line.startswith("#")]
    return {(j, e, a, "" if b == "alone" else b) for j, e, a, b in rows}


def render(undecided: list[tuple[str, str, str, str]]) -> str:
    head = (
        "# job | engine | capability | capability (alone: the first by itself with the job): what no row refuses\n"
        "# and no equivalence case or simulation of the job runs\n"
    )
    return head + "".join(" | ".join((j, e, a, b or "alone")) + "\n" for j, e, a, b in sorted(undecided))


def test_every_pair_is_decided_or_listed():
    how = decisions()
    undecided = [key for key, way in how.items() if way == "undecided"]
    new = set(undecided) - listed()
    assert not new, "pairs nothing decides (add a row, an equivalence case or a simulation):\n" + "\n".join(
        map(str, sorted(new))
    )
    decided_now = listed() - set(undecided)
    assert not decided_now, f"decided now, take them off {UNDECIDED.name} (python tests/unit/{__name__}.py)"
    counts = Counter(way.split(":")[0].rsplit(" ", 1)[0] for way in how.values())
    assert counts["row"] > 0 and counts["equivalence"] > 0 and counts["simulator"] > 0, counts


def test_the_pairs_are_every_two_capabilities_on_every_engine_for_every_job():
    assert len(FEATURES) >= 18  # the capability matrix's rows but accumulation
    jobs = {j.name for j in JOBS}
    assert {"causal-lm/sft", "causal-lm/dpo", "image-classification/classification", "image-text-to-text/sft"} <= jobs
    assert len(pairs()) > 400 * len(jobs)
    names = {(a.name, b.name) for _, _, a, b in pairs()}
    assert any(a == "tensor parallel (tp)" and b.startswith("pipeline parallel") for a, b in names)
    assert {(f.name, NONE.name) for f in FEATURES} <= names  # tasks x objectives x capabilities: each one alone
    # two values of one setting are not a pair
    assert not any({a, b} == {"LoRA (`train.method: lora`)", "QLoRA (`train.method: qlora`, bf16)"} for a, b in names)


def test_batch_norm_pairs_are_judged_with_a_model_that_has_batch_norm():
    """The teeth of the jobs' own facts: on the causal LM's Llama, a BatchNorm pair is refused by the row that says
    there is no BatchNorm; on the image classifier's ResNet it is a pair like any other, which a case must run."""
    how = decisions()
    sync, channels_last = "`parallel.sync_batchnorm`", "`parallel.channels_last`"
    assert how[("causal-lm/sft", "DDP", sync, channels_last)] == "row: sync_batchnorm_without_batchnorm"
    on_resnet = how[("image-classification/classification", "DDP", sync, "")]
    assert on_resnet.startswith("equivalence: test_classification::resnet-"), on_resnet
    assert not how[("image-classification/classification", "FSDP2", sync, channels_last)].startswith("row")


def test_holding_a_capability_reads_degrees_and_values():
    """Teeth for the matching: a degree counts above 1, a value must be the same, a train field the same."""
    tp = next(f for f in FEATURES if f.name == "tensor parallel (tp)")
    lora = next(f for f in FEATURES if f.name.startswith("LoRA"))
    assert holds(tp, Ran("x", "equivalence", {"tp": 4}))
    assert not holds(tp, Ran("x", "equivalence", {"tp": 1}))
    assert holds(lora, Ran("x", "equivalence", {}, {"method": "lora"}))
    assert not holds(lora, Ran("x", "equivalence", {}, {"method": "qlora"}))
    selective = Feature("sel", (("activation_checkpointing", "selective"),), ())
    assert not holds(selective, Ran("x", "equivalence", {"activation_checkpointing": "full"}))


if __name__ == "__main__":  # rewrite the list after deciding pairs
    UNDECIDED.write_text(render([key for key, way in decisions().items() if way == "undecided"]))
    print(f"wrote {UNDECIDED}")
