"""Several equivalence cases trained one after the other in one torchrun launch of train_and_save.py.

Starting the ranks (the launcher, then torch and transformers imported on each) costs several times what 10 steps of a
tiny model do, so the selected cases of one launch key share a launch: the world size, and whether DeepSpeed runs the
plan (DeepSpeed keeps the groups and engine state it saw first for the life of its process: its plans share only with
each other). A case that must be alone (compile, whose caches outlive a job) gets a key of its own. Each case trains
from its own recipe into its own output_dir; train_and_save.py marks each finished case with ``OUT.pt.done<rank>``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import run_torchrun, write_recipe

WORKER = Path(__file__).with_name("train_and_save.py")


def launch_key(nproc: int, parallel: dict[str, Any], alone: str = "") -> tuple[int, bool, str]:
    """Cases with one key share a launch (``alone``: a name that keeps the case to itself)."""
    return nproc, parallel.get("backend") == "deepspeed", alone


def selected(session: pytest.Session, test_name: str, *params: str) -> list[Any]:
    """The values of ``params`` (one value, or a tuple for several) of the cases this run selected (a tier, -k) of the
    tests whose name starts with ``test_name``, in collection order: only they share the launches."""
    out = []
    for item in session.items:
        if getattr(item, "originalname", "").startswith(test_name):
            values = tuple(item.callspec.params[p] for p in params)
            out.append(values[0] if len(values) == 1 else values)
    return out


@dataclass(frozen=True)
class Launched:
    proc: subprocess.CompletedProcess
    output_dir: Path
    params: Path
    jobs: int  # how many cases the launch trained

    def check_finished(self) -> None:
        """This case finished on rank 0 (a launch of several cases may fail later, in another case)."""
        done = self.params.exists() and (self.jobs == 1 or Path(f"{self.params}.done0").exists())
        assert done and (self.jobs > 1 or self.proc.returncode == 0), self.proc.stderr[-3000:]


class SharedLaunches:
    """``get(case, cases)``: the launch that trained ``case``. ``cases`` maps every case this run may ask for to its
    (launch key, recipe maker): ``recipe(output_dir) -> recipe dict``. The first case asked of a key launches every
    case of that key not run yet, in the order of ``cases``."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory, prefix: str) -> None:
        self._tmp, self._prefix = tmp_path_factory, prefix
        self._runs: dict[Hashable, Launched] = {}

    def get(self, case: Hashable, cases: dict[Hashable, tuple[tuple, Callable[[Path], dict]]]) -> Launched:
        if case not in self._runs:
            key = cases[case][0]
            group = [c for c, (k, _) in cases.items() if k == key and c not in self._runs]
            self._launch(key[0], group, cases)
        return self._runs[case]

    def _launch(self, nproc: int, group: list[Hashable], cases: dict) -> None:
        folder = self._tmp.mktemp(f"{self._prefix}-{nproc}ranks")
        args, places = [], {}
        for case in group:
            slug = "-".join(map(str, case)) if isinstance(case, tuple) else str(case)
            out, params = folder / slug, folder / f"{slug}.pt"
            args += [str(write_recipe(folder / f"{slug}.yaml", cases[case][1](out))), str(params)]
            places[case] = (out, params)
        proc = run_torchrun([str(WORKER), *args], nproc=nproc, module=False, timeout=120 + 60 * len(group))
        for case, (out, params) in places.items():
            self._runs[case] = Launched(proc, out, params, len(group))
