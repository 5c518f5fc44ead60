"""``python launch_facts.py FOLDER bigtrain-args...``: bigtrain's CLI, after writing what this rank read of its
launcher (``bigtrain.runtime.read_launch_env``) to FOLDER/rank_<RANK>.json: the multi-node test checks the node-local
facts (LOCAL_RANK, LOCAL_WORLD_SIZE) each rank of a two-agent torchrun job saw."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from bigtrain.cli import main
from bigtrain.runtime import read_launch_env

env = read_launch_env()
Path(sys.argv[1], f"rank_{env.rank}.json").write_text(json.dumps(dataclasses.asdict(env)))
sys.exit(main(sys.argv[2:]))
