"""What one rank contributes to a checkpoint: the engine's state plus the trainer's own (step, tokens, RNG).

The engine state is sharded as trained and keyed by parameter name (model and optimizer), so DCP can hand it to
another world size or plan. The RNG state is per rank (dropout draws differ between ranks), so it is keyed by rank
and restored only when the world size is unchanged; the data position needs no state of its own, because the
loader's rows are a pure function of the step (see data/order.py), except in a stream (``data.streaming``), whose
position (the same on every rank) is saved as text under ``trainer.stream``.
"""

from __future__ import annotations

from typing import Any

import torch

from bigtrain.engine.base import Engine

TRAINER = "trainer"
STREAM = "stream"


def rng_key(rank: int) -> str:
    return f"rng_rank{rank}"


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def step_source_key(rank: int) -> str:
    """Where a rank's step source (grpo's rollouts) keeps what the next steps need (its generation's batches)."""
    return f"step_source_rank{rank}"


def capture(
    engine: Engine,
    step: int,
    tokens: int,
    rank: int,
    device: torch.device,
    stream: str | None = None,
    step_source: str | None = None,
) -> dict[str, Any]:
    """The state this rank saves after ``step`` optimizer steps (``stream``: a stream's position for step + 1;
    ``step_source``: what a step source that makes the batches keeps for the steps after it)."""
    state = engine.state_dict()
    state[TRAINER] = {"step": step, "tokens": tokens, rng_key(rank): rng_state(device)}
    if stream is not None:
        state[TRAINER][STREAM] = stream
    if step_source is not None:
        state[TRAINER][step_source_key(rank)] = step_source
    return state
