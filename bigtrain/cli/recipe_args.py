"""The arguments every command that reads a recipe takes the same way (``train``, ``prepare``, ``export``)."""

from __future__ import annotations

import argparse


def add_overrides(parser: argparse.ArgumentParser, help: str = "override a recipe key") -> None:
    """``--set KEY=VALUE`` (repeatable), collected in ``args.overrides`` for ``load_recipe``."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)
