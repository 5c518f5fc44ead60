"""fp16 dynamic loss scaling whose skip decision is global."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class DynamicLossScaler:
    """Scale the loss up so fp16 gradients do not underflow; halve the scale and skip the step on overflow.

    torch's GradScaler looks for inf/NaN in each rank's own gradients; with sharded gradients one rank can overflow
    while another does not, and the ranks' optimizer steps would diverge. Here the decision comes from the global
    gradient norm, which every rank computes identically, so all ranks skip or step together.
    """

    def __init__(self, initial_scale: float, growth_interval: int = 2000) -> None:
        self.scale = initial_scale
        self.growth_interval = growth_interval
        self._clean_steps = 0

    def update(self, finite: bool) -> None:
        """After a step: halve on overflow, double after ``growth_interval`` clean steps in a row."""
        if not finite:
            self.scale /= 2.0
            self._clean_steps = 0
            return
        self._clean_steps += 1
        if self._clean_steps % self.growth_interval == 0:
            self.scale *= 2.0

    @torch.no_grad()
    def unscale(self, params: list[nn.Parameter]) -> None:
        """Divide the gradients by the scale the loss was multiplied with."""
        grads = [p.grad for p in params if p.grad is not None]
        if grads and self.scale != 1.0:
            torch._foreach_mul_(grads, 1.0 / self.scale)

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "clean_steps": self._clean_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self._clean_steps = int(state["clean_steps"])
