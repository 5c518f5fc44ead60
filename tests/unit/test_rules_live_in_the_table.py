"""No rule about what runs together outside the capability table (``config/capabilities``).

Every condition in the planner and in ``train/`` that names two or more capabilities (a backend, a plan degree, an
offload, the chunked loss, compile, FP8, the method) is either in the allow-list below, with why it is not a rule
of what runs together (a memory or time term, a table's wording), or the test fails: such a condition belongs in a
row of the table, where start-up, the planner, the simulator and export all ask it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bigtrain"
SCANNED = ("planner", "train")
BACKENDS = {"ddp", "fsdp2", "deepspeed"}
CAPABILITY_FIELDS = {
    "backend", "zero_stage", "dp_replicate", "dp_shard", "grad_reduce", "tp", "pp", "pp_schedule", "cp", "ep",
    "offload_params", "offload_optimizer", "offload_activations", "loss_chunk_tokens", "loss_parallel",
    "sequence_parallel", "activation_checkpointing", "checkpoint_every", "compile", "fp8", "method", "adapters",
}  # fmt: skip
TERM = "a memory or time term: how much a plan that runs holds or takes, not whether it runs"
ALLOWED = {
    ("planner/adapter_memory.py", "plan.offload_params or plan.offload_optimizer"): TERM,
    ("planner/adapter_memory.py", "not (plan.offload_params or plan.offload_optimizer)"): TERM,
    ("planner/adapter_memory.py", "plan.backend == 'deepspeed' and plan.zero_stage == 3"): TERM,
    ("planner/memory_terms.py", "not (plan.offload_params or plan.offload_optimizer)"): TERM,
    ("planner/memory_terms.py", "plan.backend == 'deepspeed' and plan.offload_params"): TERM,
    ("planner/memory_terms.py", "not plan.loss_chunk_tokens and (not (plan.tp > 1 and plan.loss_parallel))"): TERM,
    ("planner/cost.py", "plan.offload_params and workload.adapters"): TERM,
    ("planner/tp_time.py", "plan.tp == 1 or plan.loss_parallel"): TERM,
    ("planner/explain.py", "plan.backend == 'fsdp2' and plan.dp_replicate > 1"): "the table's name of a plan (hsdp)",
    ("planner/explain.py", "(a.backend, a.zero_stage) != (b.backend, b.zero_stage)"): (
        "the table's words for why a near tie went to the simpler plan"
    ),
    ("planner/explain.py", "a.dp_replicate < b.dp_replicate and b.backend == 'fsdp2'"): (
        "the table's words for why a near tie went to the simpler plan"
    ),
    ("planner/explain.py", "plan.checkpoint_every > 1 and plan.activation_checkpointing != 'none'"): (
        "the table's name of a plan (ac=full/2)"
    ),
    ("planner/search.py", "workload.compile == 'auto' or workload.fp8 == 'auto'"): (
        "which workloads train.X: auto weighs, not what runs with what"
    ),
    ("train/run.py", "'auto' in (cfg.train.compile, cfg.train.fp8)"): "whether the planner chooses a train option",
}


def conditions(path: Path) -> list[tuple[int, str, set[str]]]:
    """(line, source, capabilities named) of every if / elif / ternary / while / comprehension condition."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        tests = [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else []
        tests += node.ifs if isinstance(node, ast.comprehension) else []
        for test in tests:
            named = set()
            for n in ast.walk(test):
                if isinstance(n, ast.Attribute) and n.attr in CAPABILITY_FIELDS:
                    named.add(n.attr)
                if isinstance(n, ast.Constant) and n.value in BACKENDS:
                    named.add("backend")
            out.append((test.lineno, ast.unparse(test), named))
    return out


def combining_conditions() -> dict[tuple[str, str], int]:
    found = {}
    for folder in SCANNED:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            for line, source, named in conditions(path):
                if len(named) >= 2:
                    found[(str(path.relative_to(PACKAGE)), source)] = line
    return found


def test_no_condition_combines_capabilities_outside_the_table():
    found = combining_conditions()
    rules = [f"{file}:{line}: {source}" for (file, source), line in found.items() if (file, source) not in ALLOWED]
    assert not rules, "conditions that name two capabilities: make each a row of config/capabilities\n" + "\n".join(
        rules
    )


def test_the_allow_list_names_only_conditions_that_exist():
    stale = set(ALLOWED) - set(combining_conditions())
    assert not stale, f"allowed conditions no longer in the code: {sorted(stale)}"


def test_the_scan_finds_a_rule_written_outside_the_table(tmp_path):
    """Teeth: the search's old copy of a row (chunked loss only with tp = pp = 1) is found by the scan."""
    copied = tmp_path / "copied.py"
    copied.write_text("def f(v, tp, pp):\n    if v.loss_chunk_tokens and v.tp == 1 and v.pp == 1:\n        return v\n")
    [(line, source, named)] = conditions(copied)
    assert named == {"loss_chunk_tokens", "tp", "pp"} and line == 2
