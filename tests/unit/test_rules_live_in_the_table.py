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
    ("planner/names.py", "plan.backend == 'fsdp2' and plan.dp_replicate > 1"): "the table's name of a plan (hsdp)",
    ("planner/explain.py", "(a.backend, a.zero_stage) != (b.backend, b.zero_stage)"): (
        "the table's words for why a near tie went to the simpler plan"
    ),
    ("planner/explain.py", "a.dp_replicate < b.dp_replicate and b.backend == 'fsdp2'"): (
        "the table's words for why a near tie went to the simpler plan"
    ),
    ("planner/names.py", "plan.checkpoint_every > 1 and plan.activation_checkpointing != 'none'"): (
        "the table's name of a plan (ac=full/2)"
    ),
    ("planner/search.py", "workload.compile == 'auto' or workload.fp8 == 'auto'"): (
        "which workloads train.X: auto weighs, not what runs with what"
    ),
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


# --- tasks and objectives: decided in their specs (bigtrain/tasks, bigtrain/objectives), nowhere else ---------------
SPECS = ("tasks", "objectives")  # the one place a task or an objective is named in a condition
# (file, condition) -> why it is not a decision the spec should make
JOB_NAMES_ALLOWED: dict[tuple[str, str], str] = {
    ("api/request.py", "asked != AUTO_OBJECTIVE and asked not in OBJECTIVES"): (
        "an argument checked against the registry of objectives (its words name the argument as the caller spelt it)"
    ),
}
# our own constants that list tasks or objectives by name (a condition reading one decides by the name)
LISTS = ("CLASSIFIERS", "CAUSAL_LM", "IMAGE_TEXT_TO_TEXT", "IMAGE_CLASSIFICATION", "SEQUENCE_CLASSIFICATION")


def job_names() -> set[str]:
    from bigtrain.objectives import OBJECTIVES
    from bigtrain.tasks import TASKS

    return {*TASKS, *OBJECTIVES}


def naming_conditions(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, source) of every condition that names a task or an objective: a string constant of its name, or one of
    our constants that list them (``PREFERENCE_OBJECTIVES``, ``CLASSIFIERS``, ``IMAGE_TEXT_TO_TEXT``, ...)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        tests = [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else []
        tests += node.ifs if isinstance(node, ast.comprehension) else []
        for test in tests:
            for n in ast.walk(test):
                named = isinstance(n, ast.Constant) and n.value in names
                name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
                listed = name in LISTS or name.endswith("OBJECTIVES")
                if named or listed:
                    out.append((test.lineno, ast.unparse(test)))
                    break
    return out


def job_naming_conditions() -> dict[tuple[str, str], int]:
    names = job_names()
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] in SPECS:
            continue
        for line, source in naming_conditions(path, names):
            found[(str(path.relative_to(PACKAGE)), source)] = line
    return found


def test_no_condition_names_a_task_or_an_objective_outside_their_specs():
    found = job_naming_conditions()
    wrong = [f"{file}:{line}: {source}" for (file, source), line in found.items() if (file, source) not in JOB_NAMES_ALLOWED]
    assert not wrong, "conditions that name a task or an objective: make each its spec's hook or row\n" + "\n".join(
        wrong
    )


def test_the_job_allow_list_names_only_conditions_that_exist():
    stale = set(JOB_NAMES_ALLOWED) - set(job_naming_conditions())
    assert not stale, f"allowed conditions no longer in the code: {sorted(stale)}"


def test_the_scan_finds_a_task_named_outside_its_spec(tmp_path):
    """Teeth: the engine's old choice of a loss by the task, and the planner's old preference test, are found."""
    copied = tmp_path / "copied.py"
    copied.write_text(
        "def f(task, w, PREFERENCE_OBJECTIVES):\n"
        "    if task.name == 'image-classification':\n        return 1\n"
        "    return 2 if w.objective in PREFERENCE_OBJECTIVES else 3\n"
    )
    found = naming_conditions(copied, job_names())
    assert [line for line, _ in found] == [2, 4]
