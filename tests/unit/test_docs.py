"""The docs say what the code does: the generated parts match the code, every command shown is either run by a test
or marked as needing a GPU or several machines, and the README stays short."""

from __future__ import annotations

import importlib.util
import re

import pytest
from helpers import COMMANDS_BLOCK, DOCS, NEEDS_MARK, REPO, commands_of, docs_blocks, docs_commands

README_MAX_LINES = 200
FENCE = re.compile(r"```bash\n(.*?)```", re.S)


def generator():
    spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_stays_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


@pytest.mark.parametrize("path", ["README.md", "docs/recipes.md", "docs/architecture.md"])
def test_generated_blocks_match_the_code(path):
    """The recipe key table (from config/schema.py), the capability matrix (from config/capabilities/ and the
    planner): rerun ``python docs/generate.py`` when this fails."""
    gen = generator()
    target = REPO / path
    assert target.read_text() == gen.rendered(target), f"{path} differs from what docs/generate.py writes"


def test_every_command_shown_is_run_by_a_test_or_marked():
    """A bash block is named (``<!-- commands:NAME -->``) and a test reads and runs its commands, or every command in
    it is marked ``# needs a GPU`` / ``# needs N GPUs`` / ``# needs several machines``."""
    tests = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py"))
    unmarked = []
    for path in DOCS:
        text = path.read_text()
        named = {body for _, body in COMMANDS_BLOCK.findall(text)}
        for body in FENCE.findall(text):
            if body not in named and commands_of(body):
                unmarked.append(f"{path.name}: {commands_of(body)[0]}")
    assert not unmarked, "commands no test runs and nothing marks:\n" + "\n".join(unmarked)
    spec = importlib.util.spec_from_file_location("bench_commands", REPO / "tests" / "bench" / "test_bench_commands.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for name, (path, commands) in docs_blocks().items():
        if name.startswith("bench-"):  # run as written by tests/bench (python -m pytest -m bench)
            assert set(commands) <= set(bench.COMMANDS), f"{path.name}: tests/bench does not run block {name!r}"
            continue
        used = f'docs_commands("{name}")' in tests
        assert used or not commands, f"{path.name}: no test runs the commands of block {name!r}"


def test_the_marks_are_recognised():
    body = "bigtrain train r.yaml  # needs 8 GPUs\nsrun x  # needs several machines\nbigtrain plan r.yaml\n"
    assert commands_of(body) == ["bigtrain plan r.yaml"]
    assert len(commands_of(body, include_marked=True)) == 3
    assert NEEDS_MARK.search("x  # needs a GPU")


def test_ci_runs_the_readme_s_test_command():
    """.ci/run installs what the README's second quick-start command installs and runs its checks, in order."""
    (_, test_command) = docs_commands("quickstart")
    ci = (REPO / ".ci" / "run").read_text()
    parts = [part.strip() for part in test_command.split("&&")]
    assert parts[-2:] == ["ruff check .", "python -m pytest -q"]
    positions = [ci.index(part) for part in ("pip install -q torch==2.13.0", "ruff check .", "python -m pytest -q")]
    assert positions == sorted(positions)
    pinned = "pip install -c constraints.txt -e '.[dev]'"  # the versions the suite passed on, in both
    assert pinned.replace("pip install", "pip install -q") in ci and pinned in test_command
    assert (REPO / "constraints.txt").read_text().count("\ntransformers==") == 1
