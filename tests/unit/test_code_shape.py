"""Small modules with one job: no source file of bigtrain over ~500 lines, no function over ~80."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "bigtrain"
SOURCES = sorted(PACKAGE.rglob("*.py"))
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_files_and_functions_stay_small(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_FILE_LINES, f"{path.name}: {len(text.splitlines())} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            assert lines <= MAX_FUNCTION_LINES, f"{path.name}: {node.name} has {lines} lines"
