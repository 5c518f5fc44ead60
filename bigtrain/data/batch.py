"""A micro-batch as the engines see it: token ids, their next-token labels and, for packed documents, positions.

The labels are already shifted (``labels[:, t]`` is what position ``t`` predicts) and hold IGNORE_INDEX where a
position predicts nothing: the last position of a row, padding, a prompt or a user turn (masked fine-tuning data),
the first token of the next packed document. The loss and the token count that normalises it both read these
labels, so the two agree by construction whatever the data format.

``position_ids`` restart at 0 at each packed document. HF's attention-mask builder reads a restart as a new sequence
and keeps attention inside each one (block-diagonal causal mask for eager/SDPA, varlen for flash attention), so a
packed document never sees its neighbours. ``None``: one continuous stream per row (pre-training packing).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from bigtrain.data.labels import IGNORE_INDEX, next_token_labels


@dataclass(frozen=True)
class MicroBatch:
    input_ids: torch.Tensor  # [micro_batch_size, seq_len]
    labels: torch.Tensor  # [micro_batch_size, seq_len], shifted, IGNORE_INDEX where nothing is predicted
    position_ids: torch.Tensor | None = None  # [micro_batch_size, seq_len], restarting at each packed document

    @classmethod
    def of_ids(cls, input_ids: torch.Tensor) -> MicroBatch:
        """Every position predicts the next token of its row (plain causal-LM training)."""
        return cls(input_ids, next_token_labels(input_ids))

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments of the HF model's forward."""
        inputs = {"input_ids": self.input_ids}
        if self.position_ids is not None:
            inputs["position_ids"] = self.position_ids
        return inputs

    def sequence_slice(self, index: int, parts: int) -> MicroBatch:
        """Slice ``index`` of ``parts`` equal, contiguous slices of every row (context parallelism): the tokens,
        their labels (shifted on the whole row, so a slice's last label is the next slice's first token) and their
        positions in the whole row."""
        length = self.input_ids.shape[1] // parts
        window = slice(index * length, (index + 1) * length)
        if self.position_ids is not None:
            positions = self.position_ids[:, window]
        else:
            positions = torch.arange(window.start, window.stop, device=self.input_ids.device)
            positions = positions.expand(self.input_ids.shape[0], -1)
        return MicroBatch(self.input_ids[:, window], self.labels[:, window], positions)

    def to(self, device: torch.device) -> MicroBatch:
        pos = None if self.position_ids is None else self.position_ids.to(device, non_blocking=True)
        return MicroBatch(self.input_ids.to(device, non_blocking=True), self.labels.to(device, non_blocking=True), pos)

    def pin_memory(self) -> MicroBatch:
        pos = None if self.position_ids is None else self.position_ids.pin_memory()
        return MicroBatch(self.input_ids.pin_memory(), self.labels.pin_memory(), pos)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.input_ids, self.labels, self.position_ids) if t is not None]

    def trimmed(self, multiple: int) -> MicroBatch:
        """The columns up to the last one that predicts a token, rounded up to ``multiple`` (at most the rows'
        length): right padding beyond every row's last target changes no earlier position of a causal model (what
        the HF Trainer's and TRL's collators do by padding to the longest row)."""
        width = self.input_ids.shape[1]
        predicting = (self.labels != IGNORE_INDEX).any(0).nonzero()
        last = int(predicting[-1]) + 1 if len(predicting) else 1
        keep = min(width, -(-last // multiple) * multiple)
        if keep == width:
            return self
        positions = None if self.position_ids is None else self.position_ids[:, :keep]
        return MicroBatch(self.input_ids[:, :keep], self.labels[:, :keep], positions)

    def without_labels(self, rows: torch.Tensor) -> MicroBatch:
        """The rows where ``rows`` ([micro_batch_size] bool) is set predict nothing (evaluation fillers)."""
        return replace(self, labels=self.labels.masked_fill(rows[:, None], IGNORE_INDEX))


def concat(micro_batches: list[MicroBatch]) -> MicroBatch:
    """One batch of all rows (a pipeline schedule splits it back into the micro-batches along dim 0)."""
    positions = [m.position_ids for m in micro_batches]
    has_positions = any(p is not None for p in positions)
    if has_positions and not all(p is not None for p in positions):
        raise ValueError("either every micro-batch carries position_ids or none does")
    return MicroBatch(
        torch.cat([m.input_ids for m in micro_batches]),
        torch.cat([m.labels for m in micro_batches]),
        torch.cat(positions) if has_positions else None,  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class ExampleBatch:
    """A micro-batch of a classification task: the model's inputs (``pixel_values``, or ``input_ids`` with their
    ``attention_mask``) and one label per example (IGNORE_INDEX for an evaluation filler, which counts nothing)."""

    inputs: dict[str, torch.Tensor]
    labels: torch.Tensor  # [micro_batch_size]

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return dict(self.inputs)

    def to(self, device: torch.device) -> ExampleBatch:
        # pinned host tensors (the loader's) copy without blocking the host
        inputs = {k: v.to(device, non_blocking=True) for k, v in self.inputs.items()}
        return ExampleBatch(inputs, self.labels.to(device, non_blocking=True))

    def pin_memory(self) -> ExampleBatch:
        return ExampleBatch({k: v.pin_memory() for k, v in self.inputs.items()}, self.labels.pin_memory())

    def tensors(self) -> list[torch.Tensor]:
        return [*self.inputs.values(), self.labels]

    def without_labels(self, rows: torch.Tensor) -> ExampleBatch:
        """The examples where ``rows`` ([micro_batch_size] bool) is set predict nothing (evaluation fillers)."""
        return ExampleBatch(self.inputs, self.labels.masked_fill(rows, IGNORE_INDEX))


@dataclass(frozen=True)
class PairBatch:
    """A micro-batch of preference pairs (``losses/preference.py``): m pairs as 2m rows, the m prompt+chosen rows
    then the m prompt+rejected rows (a pair is never split across micro-batches or ranks), right-padded, labelled on
    the answer only (already shifted; padding and prompt IGNORE_INDEX). ``ref_logps``: the reference model's
    log-probability of each row's answer ([2m], fp32), precomputed with the data or filled by the engine's reference
    before the policy's forward; None until then."""

    input_ids: torch.Tensor  # [2m, seq_len]
    labels: torch.Tensor  # [2m, seq_len]
    ref_logps: torch.Tensor | None = None

    def model_inputs(self) -> dict[str, torch.Tensor]:
        # right padding under a causal mask: no real token attends to a pad, so no attention mask is needed
        return {"input_ids": self.input_ids}

    def with_reference(self, ref_logps: torch.Tensor) -> PairBatch:
        return replace(self, ref_logps=ref_logps)

    def to(self, device: torch.device) -> PairBatch:
        ref = None if self.ref_logps is None else self.ref_logps.to(device, non_blocking=True)
        return PairBatch(self.input_ids.to(device, non_blocking=True), self.labels.to(device, non_blocking=True), ref)

    def pin_memory(self) -> PairBatch:
        ref = None if self.ref_logps is None else self.ref_logps.pin_memory()
        return PairBatch(self.input_ids.pin_memory(), self.labels.pin_memory(), ref)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.input_ids, self.labels, self.ref_logps) if t is not None]

    def without_labels(self, rows: torch.Tensor) -> PairBatch:
        """The pairs where ``rows`` ([m] bool) is set predict nothing (evaluation fillers): both of their rows."""
        both = torch.cat([rows, rows])
        return replace(self, labels=self.labels.masked_fill(both[:, None], IGNORE_INDEX))


@dataclass(frozen=True)
class ImageChatBatch:
    """A micro-batch of conversations with images (``model.task: image-text-to-text``): the token rows with the
    image tokens the processor expanded, their labels (already shifted, on the assistant's tokens only; image
    tokens, prompts and padding IGNORE_INDEX), and the processor's other tensors (``attention_mask``, the images'
    ``pixel_values`` and the family's own: Qwen-VL's ``image_grid_thw``, Idefics3's ``pixel_attention_mask``, ...)."""

    input_ids: torch.Tensor  # [micro_batch_size, seq_len]
    labels: torch.Tensor  # [micro_batch_size, seq_len]
    inputs: dict[str, torch.Tensor]

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, **self.inputs}

    def to(self, device: torch.device) -> ImageChatBatch:
        inputs = {k: v.to(device, non_blocking=True) for k, v in self.inputs.items()}
        return ImageChatBatch(
            self.input_ids.to(device, non_blocking=True), self.labels.to(device, non_blocking=True), inputs
        )

    def pin_memory(self) -> ImageChatBatch:
        inputs = {k: v.pin_memory() for k, v in self.inputs.items()}
        return ImageChatBatch(self.input_ids.pin_memory(), self.labels.pin_memory(), inputs)

    def tensors(self) -> list[torch.Tensor]:
        return [self.input_ids, self.labels, *self.inputs.values()]

    def without_labels(self, rows: torch.Tensor) -> ImageChatBatch:
        """The rows where ``rows`` ([micro_batch_size] bool) is set predict nothing (evaluation fillers)."""
        return replace(self, labels=self.labels.masked_fill(rows[:, None], IGNORE_INDEX))
