"""A micro-batch of grpo completions (``roles/rollout.py`` makes them, ``losses/grpo.py`` reads them).

Each row is a prompt then one completion, right-padded; the labels (already shifted) mark the completion's tokens
only, so a row's labelled positions are its completion. Beside the tokens: the completion's advantage, the
generating policy's log-probability of each completion token (``old_logps``: where the batch is trained on more than
once, train.num_iterations > 1; None: the policy's own, detached) and the reference model's (``ref_logps``, filled by
the engine's reference before the policy's forward; None without one). Per-token values are [rows, length] fp32,
aligned with the labels, 0 where nothing is labelled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from bigtrain.data.labels import IGNORE_INDEX, token_logps


@dataclass(frozen=True)
class RolloutBatch:
    input_ids: torch.Tensor  # [m, length]
    labels: torch.Tensor  # [m, length], shifted; IGNORE_INDEX except on completion tokens
    advantages: torch.Tensor  # [m] fp32
    temperature: float = 1.0  # the sampling temperature the log-probabilities are taken at
    old_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None

    def model_inputs(self) -> dict[str, torch.Tensor]:
        # right padding under a causal mask: no real token attends to a pad, so no attention mask is needed
        return {"input_ids": self.input_ids}

    def with_reference(self, ref_logps: torch.Tensor) -> RolloutBatch:
        return replace(self, ref_logps=ref_logps)

    def reference_from(self, logits: torch.Tensor) -> torch.Tensor:
        """What the reference's forward gives this batch: its per-token log-probabilities at the temperature."""
        return token_logps(logits, self.labels, self.temperature).detach()

    def _map(self, fn: object) -> RolloutBatch:
        def f(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else fn(t)  # type: ignore[operator]

        return RolloutBatch(
            f(self.input_ids), f(self.labels), f(self.advantages), self.temperature, f(self.old_logps),
            f(self.ref_logps),
        )  # fmt: skip

    def to(self, device: torch.device) -> RolloutBatch:
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> RolloutBatch:
        return self._map(lambda t: t.pin_memory())

    def tensors(self) -> list[torch.Tensor]:
        parts = (self.input_ids, self.labels, self.advantages, self.old_logps, self.ref_logps)
        return [t for t in parts if t is not None]

    def without_labels(self, rows: torch.Tensor) -> RolloutBatch:
        return replace(self, labels=self.labels.masked_fill(rows[:, None], IGNORE_INDEX))
