import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # so tests can `import helpers`
from tiers import stale_entries, tier_of  # noqa: E402


@pytest.fixture(autouse=True)
def _torch_linear_as_found():
    """Each test leaves ``F.linear`` as it found it. ``deepspeed.zero.Init`` replaces it for the whole process; a run
    gives it back when its engine closes (``DeepSpeedZeroEngine.close``), but a test that builds a ZeRO-3 engine
    itself and drops it would leave ZeRO-3's wrapper to every later test of the process (a QLoRA reference's NF4
    linears fail in it)."""
    yield
    functional = sys.modules.get("torch.nn.functional")
    if functional is not None:
        import torch

        functional.linear = torch._C._nn.linear  # what torch.nn.functional defines it as


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """``-m full`` is every test (the default tier's, those marked ``full`` and those marked ``extended``), the GPU
    tier and the benchmarks aside. Asked for exactly so, every such test is marked ``full`` before pytest selects by
    marker. CI runs the default tier, then ``-m "full and not bench and not extended"``: the tests marked ``full``
    themselves. ``tests/tiers.py`` marks the tests its lists name (docs/testing.md says why a third tier exists: CI's
    time)."""
    ids = {item: f"{item.path.relative_to(ROOT).as_posix()}::{item.nodeid.split('::', 1)[1]}" for item in items}
    for item, test_id in ids.items():
        tier = tier_of(test_id)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
    # a module some of whose tests were named on the command line (path::test) is collected in part: its other
    # entries are not judged by this run
    named = [Path(arg.split("::", 1)[0]).resolve() for arg in config.args if "::" in arg]
    partial = {path.relative_to(ROOT).as_posix() for path in named if path.is_relative_to(ROOT)}
    unmatched = [e for e in stale_entries(ids.values(), ROOT) if e.split("::", 1)[0] not in partial]
    if unmatched:
        raise pytest.UsageError(f"tests/tiers.py names tests that do not exist: {', '.join(unmatched)}")
    if config.option.markexpr.strip() != "full":
        return
    for item in items:
        if item.get_closest_marker("bench") is None and item.get_closest_marker("gpu") is None:
            item.add_marker(pytest.mark.full)


@pytest.fixture
def cli_in_process(capfd):
    """``bigtrain plan|export ...`` through the CLI's own ``main`` in this process: it starts no process group and no
    worker, so a fresh interpreter per call (4 s of imports) would buy nothing. Exit code and output as a process's;
    ``timeout`` is accepted for the same call shape as ``run_cli``."""

    def run(args: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
        from bigtrain.cli import main

        capfd.readouterr()
        try:
            code = main(args)
        except SystemExit as e:  # argparse's own errors
            code = e.code if isinstance(e.code, int) else 2
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(["bigtrain", *args], code, out, err)

    return run
