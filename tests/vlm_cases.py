"""Vision-language memory cases at the widths users train (Qwen2.5-VL-7B, Gemma-3-4B), trimmed to two decoder layers
and two vision blocks: the planner's peak against bigtrain's own step simulated on fake tensors (rank 0 of an
N-rank job, ``bigtrain/measure/simulate.py`` with ``tasks/image_chat_inputs.py``'s batch). Read by
``bench/vlm_memory.py`` (the table in bench/results/vlm_memory.md) and ``tests/distributed/test_vlm_memory.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from helpers import make_plan

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.job import job_facts
from bigtrain.planner.model_stats import load_model_config

LAYERS = BLOCKS = 2  # decoder layers and vision blocks kept (Qwen's second block is its full-attention one)


def vlm_config(preset: str, blocks: int = BLOCKS) -> dict[str, Any]:
    """``preset``'s full config with its language model trimmed to LAYERS and its vision tower to ``blocks``."""
    config = load_model_config(preset)
    text, vision = config["text_config"], config["vision_config"]
    text["num_hidden_layers"] = LAYERS
    if "layer_types" in text:  # one entry per layer (Gemma 3's sliding and global pattern, Qwen2's)
        text["layer_types"] = text["layer_types"][:LAYERS]
    key = "depth" if "depth" in vision else "num_hidden_layers"
    if "fullatt_block_indexes" in vision:
        vision["fullatt_block_indexes"] = [i for i in vision.get("fullatt_block_indexes", []) if i < blocks] or [blocks - 1]
    vision[key] = blocks
    return load_model_config(config)


@dataclass(frozen=True)
class VlmCase:
    preset: str
    images: int  # per row
    image_size: int  # pixels per side
    method: str = "full"  # or lora / qlora (the language model's linears; the tower and projector frozen base)
    backend: str = "fsdp2"
    zero_stage: int = 3
    world: int = 8
    ac: str = "none"
    seq_len: int = 2048
    frozen: tuple[str, ...] = ()  # model.freeze
    tp: int = 1  # the language model's blocks sliced over tp ranks (the tower whole on each)
    blocks: int = BLOCKS  # vision blocks kept (the whole tower: what the tower's terms weigh in a real run)

    @property
    def name(self) -> str:
        frozen = "".join(f"-frozen_{p}" for p in self.frozen)
        return (
            f"{self.method}-{self.preset}-{self.images}x{self.image_size}px-{self.blocks}blocks-L{self.seq_len}-"
            f"{self.backend}{self.zero_stage}-N{self.world}{f'-tp{self.tp}' if self.tp > 1 else ''}-{self.ac}{frozen}"
        )

    def config(self) -> dict[str, Any]:
        return vlm_config(self.preset, self.blocks)

    def plan(self) -> Plan:
        if self.backend == "ddp":
            return make_plan(
                backend="ddp", zero_stage=0, grad_reduce="once_per_step", dp_replicate=self.world,
                activation_checkpointing=self.ac,
            )  # fmt: skip
        return make_plan(
            zero_stage=self.zero_stage, dp_shard=self.world // self.tp, tp=self.tp, activation_checkpointing=self.ac
        )

    def workload(self) -> Workload:
        return Workload(
            seq_len=self.seq_len,
            global_batch_size=2 * self.world,  # two micro-steps: the gradients kept between them are in the peak
            image_size=self.image_size,
            images_per_row=float(self.images),
            method=self.method,
            frozen=self.frozen,
            job=job_facts(task_name="image-text-to-text"),
        )


QWEN, GEMMA = "qwen2.5-vl-7b", "gemma-3-4b"
VLM_MEMORY_CASES = [
    VlmCase(QWEN, 1, 448),
    VlmCase(QWEN, 1, 448, "lora"),
    VlmCase(QWEN, 1, 1024),
    VlmCase(QWEN, 1, 1024, "lora"),
    VlmCase(QWEN, 4, 448),
    VlmCase(QWEN, 4, 448, "lora"),
    VlmCase(QWEN, 2, 1024, seq_len=4096),
    VlmCase(QWEN, 2, 1024, "lora", seq_len=4096),
    VlmCase(QWEN, 2, 1024, ac="full", seq_len=4096),
    VlmCase(QWEN, 1, 1024, frozen=("vision_tower",)),
    VlmCase(QWEN, 2, 768, zero_stage=2),
    VlmCase(QWEN, 1, 448, "lora", backend="ddp", zero_stage=0),
    VlmCase(QWEN, 2, 1024, "qlora", seq_len=4096),
    VlmCase(QWEN, 2, 1024, seq_len=4096, tp=2),
    VlmCase(QWEN, 1, 448, tp=4),
    VlmCase(GEMMA, 1, 896),
    VlmCase(GEMMA, 1, 896, "lora"),
    VlmCase(GEMMA, 4, 896),
    VlmCase(GEMMA, 4, 896, "lora"),
    VlmCase(GEMMA, 2, 896, "qlora"),
    VlmCase(GEMMA, 2, 896, ac="full"),
    VlmCase(GEMMA, 2, 896, frozen=("vision_tower", "projector")),
    # the whole tower, whose terms then weigh as in a real run (Qwen's 32 blocks of windowed attention simulate in
    # about 2 minutes: bench only)
    VlmCase(QWEN, 2, 1024, seq_len=4096, blocks=32),
    VlmCase(GEMMA, 4, 896, blocks=27),
]
BENCH_ONLY = ("full-qwen2.5-vl-7b-2x1024px-32blocks-L4096-fsdp23-N8-none",)
