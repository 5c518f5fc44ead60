"""Print the installed versions of bigtrain[dev]'s whole dependency tree as pip constraints (constraints.txt's body).

Run after the suite passed on a fresh install: ``python .ci/pin_versions.py`` (then keep constraints.txt's header)."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(root: str = "bigtrain", extras: tuple[str, ...] = ("dev",)) -> dict[str, str]:
    """name -> installed version (local labels such as +cpu dropped) of everything ``root[extras]`` requires."""
    found: dict[str, str] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()  # a package is walked again for extras it was not walked with

    def walk(name: str, with_extras: tuple[str, ...] = ()) -> None:
        try:
            dist = distribution(name)
        except PackageNotFoundError:  # an optional dependency of a dependency
            return
        key = _key(dist.metadata["Name"])
        if (key, with_extras) in seen:
            return
        seen.add((key, with_extras))
        found[key] = dist.version.split("+")[0]
        for line in dist.requires or []:
            req = Requirement(line)
            markers = [{"extra": e} for e in ("", *with_extras)]
            if req.marker is None or any(req.marker.evaluate(m) for m in markers):
                walk(req.name, tuple(sorted(req.extras)))  # bigtrain[dev] names bigtrain[wandb, ...]

    walk(root, extras)
    found.pop(_key(root))
    return found


if __name__ == "__main__":
    for name, version in sorted(pinned().items()):
        print(f"{name}=={version}")
