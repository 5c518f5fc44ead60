"""What the planner knows of a classifier (``ClassifierStats``), as a plain value: measured on fake tensors by
``classifier_stats.py``, or for a preset at its default size recorded in ``known_configs.json`` (read without torch,
as an LM preset's config is), so that ``bigtrain plan --model resnet-50`` answers as fast as ``--model llama-3-8b``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bigtrain.config.model_facts import ModelFacts

CHECKPOINTED = "+ac"  # a regime's name with this suffix: every block under full activation checkpointing


@dataclass(frozen=True)
class ClassifierStats:
    model_type: str
    task: str  # model.task (image-classification, sequence-classification)
    unit: str  # what throughput counts: images or examples
    params: int
    convolutional: bool  # convolutions throughout (ResNet, ConvNeXt), not only a patch embedding (ViT): its
    # achievable FLOP rate is lower and it trains channels-last (planner/classifier_plan.py)
    batch_norm: bool
    flops_per_example: float  # forward + backward
    operators: int  # torch operators one micro-step launches (forward + backward), whatever its size
    per_example: tuple[tuple[str, float], ...]  # (regime, activation bytes per example)
    fixed: tuple[tuple[str, float], ...]  # (regime, activation bytes whatever the batch)
    example: str  # what one example is, in words (3x224x224 px, 512 tokens)
    # the repeated blocks' parameters in forward order (each an FSDP2 unit; the root holds the rest) and each one's
    # share of the activations per example (in the cast regime; under full checkpointing, its inputs'): FSDP2's
    # backward releases them last block first
    units: tuple[int, ...]
    unit_shares: tuple[float, ...]
    checkpointed_shares: tuple[float, ...]
    # train.method=lora: (in, out) of every linear the default adapters adapt, and the head's parameters (trained
    # fully); empty: LoRA does not apply (a CNN's blocks hold convolutions)
    adapted: tuple[tuple[int, int], ...] = ()
    head_params: int = 0
    facts: ModelFacts | None = None  # what the capability table reads of the model (which plans may run)

    @property
    def blocks(self) -> int:
        """The repeated blocks FSDP2 shards and checkpointing wraps (0: none found)."""
        return len(self.units)

    @property
    def largest_unit(self) -> int:
        """Parameters of the largest FSDP2 unit: a block, or the root's own (all but the blocks')."""
        return max([*self.units, self.params - sum(self.units)])

    def lora_params(self, rank: int) -> int:
        """Parameters LoRA trains at this rank: the adapters (r x (in + out) each) and the head."""
        return sum(rank * (i + o) for i, o in self.adapted) + self.head_params

    def activations(self, regime: str, micro_batch_size: int, checkpointed: bool = False) -> float:
        """Bytes of activations and temporaries at the step's peak for a micro-batch of this size (``checkpointed``:
        every block under full activation checkpointing); the ``lora`` regime is ``cast`` where LoRA does not apply."""
        if regime not in dict(self.per_example):
            regime = "cast"
        key = regime + CHECKPOINTED if checkpointed else regime
        return dict(self.fixed)[key] + dict(self.per_example)[key] * micro_batch_size

    @property
    def describe(self) -> str:
        return f"{self.model_type} {self.task} ({self.example} per example)"


def stats_key(image_size: int, seq_len: int, mixed_precision: str) -> str:
    """Which measurement a record holds: the example's size and the compute dtype."""
    return f"{image_size}px/{seq_len}tok/{mixed_precision}"


def stats_to_dict(stats: ClassifierStats) -> dict[str, Any]:
    return asdict(stats)


def stats_from_dict(data: dict[str, Any]) -> ClassifierStats:
    """A recorded ``ClassifierStats`` (JSON's lists back into the tuples it holds)."""
    facts = data.get("facts")
    return ClassifierStats(
        **{
            **data,
            "per_example": tuple(tuple(x) for x in data["per_example"]),
            "fixed": tuple(tuple(x) for x in data["fixed"]),
            "adapted": tuple(tuple(x) for x in data["adapted"]),
            "units": tuple(data["units"]),
            "unit_shares": tuple(data["unit_shares"]),
            "checkpointed_shares": tuple(data["checkpointed_shares"]),
            "facts": None if facts is None else ModelFacts(**{**facts, "tp_styles": tuple(facts["tp_styles"])}),
        }
    )
