"""The package layers, read from the imports of every source file (including imports inside functions).

config < planner | data | models | runtime < parallel | losses | integrations < engine < checkpoint | roles < tasks |
objectives < job < train < measure < api < cli: a module may import only from lower layers and its own package. The
specs of tasks and objectives sit above everything they describe (data readers, planner statistics, losses, roles,
export) and below what runs a job: nothing under them knows a task or an objective by its name. The planner must stay pure: no ``torch.distributed`` and nothing of
the trainer, so every rank (and a laptop) computes the same plan from the same numbers. The training loop must not
learn which backend it drives.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "bigtrain"

LAYERS = {
    "errors": 0,
    "config": 1,
    "planner": 2,
    "data": 2,
    "models": 2,
    "rewards": 2,  # reward functions shipped for grpo recipes: user-level code, importing nothing of bigtrain
    "runtime": 2,
    "parallel": 3,
    "losses": 3,  # what a step minimises: below the engines that drive it
    "integrations": 3,
    "engine": 4,
    "checkpoint": 5,
    "roles": 5,  # models a job needs besides the policy (the reference), attached to an engine
    "tasks": 6,  # one spec per model.task: everything a task decides, over the layers below
    "objectives": 6,  # one spec per train.objective (its losses live in losses/)
    "job": 7,  # a task and an objective resolved together
    "train": 8,
    "measure": 9,  # probe, tp probe, simulator: they run the real stack to check the planner
    "api": 10,
    "cli": 11,
    "__main__": 12,
}


def component(path: Path) -> str:
    """The first name under bigtrain/ ('planner' for bigtrain/planner/search.py, 'simulate' for simulate.py)."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the source, wherever it appears."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def test_every_component_has_a_layer():
    assert {component(p) for p in SOURCES} <= set(LAYERS)


def upward_imports(mine: str, source: str) -> list[str]:
    wrong = []
    for line, module in imported_modules(source):
        parts = module.split(".")
        if parts[0] != "bigtrain" or len(parts) < 2:
            continue
        theirs = parts[1]
        if theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
            wrong.append(f"line {line}: {mine} (layer {LAYERS[mine]}) imports {module} (layer {LAYERS[theirs]})")
    return wrong


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_go_down(path):
    wrong = upward_imports(component(path), path.read_text())
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", sorted((PACKAGE / "planner").glob("*.py")), ids=lambda p: p.name)
def test_planner_is_pure(path):
    for line, module in imported_modules(path.read_text()):
        assert not module.startswith("torch.distributed"), f"line {line} imports {module}"
        assert not module.startswith(("bigtrain.train", "bigtrain.engine", "bigtrain.parallel")), f"line {line}"


def test_training_loop_never_names_a_backend():
    for path in (PACKAGE / "train").glob("*.py"):
        text = path.read_text()
        for name in ("backend", "fsdp", "ddp", "deepspeed", "DistributedDataParallel"):
            assert name not in text.lower(), f"{path.name} mentions {name!r}"


def test_the_checker_catches_upward_and_sideways_imports():
    lazy_upward = "def f():\n    from bigtrain.train.loop import TrainLoop\n"
    assert upward_imports("engine", lazy_upward) == ["line 2: engine (layer 4) imports bigtrain.train.loop (layer 8)"]
    assert upward_imports("data", "import bigtrain.models.build\n")  # same layer, other package
    assert not upward_imports("engine", "from bigtrain.parallel.build import build_model\n")
