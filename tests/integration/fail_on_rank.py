"""``python fail_on_rank.py RANK STEP bigtrain-args...``: bigtrain's CLI with one injected fault.

On global rank RANK, the forward-backward of optimizer step STEP (1-based) raises, while the other ranks are inside
that step's collectives. Launched under torchrun by tests/integration/test_bad_input.py, to check that a failure on
one rank mid-training ends the whole job promptly instead of leaving its peers waiting.
"""

from __future__ import annotations

import os
import sys

from bigtrain.cli import main
from bigtrain.engine.torch_native import TorchNativeEngine

fail_rank, fail_step = int(sys.argv[1]), int(sys.argv[2])
original = TorchNativeEngine.forward_backward
calls = 0


def forward_backward(self, micro_batches, loss_factor):
    global calls
    calls += 1
    if int(os.environ["RANK"]) == fail_rank and calls == fail_step:
        raise RuntimeError(f"injected failure on rank {fail_rank} in step {fail_step}")
    return original(self, micro_batches, loss_factor)


TorchNativeEngine.forward_backward = forward_backward
sys.exit(main(sys.argv[3:]))
