"""``python faults.py FAULT ARG bigtrain-args...``: bigtrain's CLI with one injected fault, for the crash tests.

- ``kill-before-publish STEP``: rank 0 SIGKILLs itself while publishing the checkpoint of step STEP, after every
  rank's DCP files are written and half of the manifest is, before the rename: a save killed half-way.
- ``crash-once MARKER``: rank 1 exits with code 1 at the start of its third optimizer step of this start, unless
  file MARKER exists (it creates it first): the first attempt crashes, the attempt torchrun restarts does not.
- ``disk-full STEP``: the disk is full when the checkpoint of step STEP is written: each rank's DCP data file of
  that save is made a link to /dev/full, so the kernel answers its writes with ENOSPC, as a full disk does.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from bigtrain.checkpoint import layout
from bigtrain.cli import main
from bigtrain.train.loop import TrainLoop

fault, arg = sys.argv[1], sys.argv[2]

if fault == "kill-before-publish":
    kill_at = int(arg)
    write_manifest = layout.Manifest.write

    def write_then_die(self, folder):
        if self.step == kill_at:
            (folder / layout.MANIFEST).write_text('{"step": ')
            os.kill(os.getpid(), signal.SIGKILL)
        write_manifest(self, folder)

    layout.Manifest.write = write_then_die
elif fault == "crash-once":
    marker = Path(arg)
    run_step = TrainLoop.run_step
    calls = 0

    def crash_on_third_step(self, step):
        global calls
        calls += 1
        if calls == 3 and int(os.environ["RANK"]) == 1 and not marker.exists():
            marker.touch()
            os._exit(1)
        return run_step(self, step)

    TrainLoop.run_step = crash_on_third_step
elif fault == "disk-full":
    from bigtrain.checkpoint.saver import Checkpointer

    full_at = int(arg)
    save = Checkpointer.save

    def save_onto_a_full_disk(self, step, tokens):
        if step == full_at:
            partial = layout.partial_dir(self.root, step)
            partial.mkdir(parents=True, exist_ok=True)
            (partial / f"__{self.rank}_0.distcp").symlink_to("/dev/full")
        save(self, step, tokens)

    Checkpointer.save = save_onto_a_full_disk
else:
    raise SystemExit(f"unknown fault {fault!r}")
sys.exit(main(sys.argv[3:]))
