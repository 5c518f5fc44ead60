"""The classifier planner's peak memory against bigtrain's own training step simulated on fake tensors.

Real widths (ResNet-50, ConvNeXt-B, ViT-L/16, BERT-large), micro-batches 32 to 256, 224 to 384 px and 256 to 512
tokens, DDP and FSDP2 (zero_stage 2 and 3, with accumulation), with and without full activation checkpointing (the
models without BatchNorm), full training and LoRA: rank 0 of 2 or 4, bf16. DeepSpeed's step does not run on fake tensors
(``measure/simulate.py``).

    python bench/classifier_memory.py            # writes bench/results/classifier_memory.md
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigtrain.config.capabilities import option_defaults
from bigtrain.config.plan import DEFAULT_GRAD_REDUCE, Plan
from bigtrain.config.workload import Workload
from bigtrain.job import job_facts
from bigtrain.measure.simulate import simulate
from bigtrain.planner.classifier_plan import classifier_model
from bigtrain.planner.model_stats import load_model_config

RESULTS = Path(__file__).parent / "results" / "classifier_memory.md"


@dataclass(frozen=True)
class Case:
    preset: str
    backend: str
    zero_stage: int
    dp: int
    micro_batch: int
    accum: int
    image_size: int = 0  # 0: a text classifier, at seq_len tokens
    seq_len: int = 0
    checkpointed: bool = False  # full activation checkpointing of every block
    lora: bool = False  # train.method=lora (rank 16 on the blocks' linears, the head trained fully)

    @property
    def name(self) -> str:
        size = f"{self.image_size}px" if self.image_size else f"{self.seq_len}tok"
        plan = self.backend if self.backend == "ddp" else f"{self.backend}-z{self.zero_stage}"
        suffix = "-ac" * self.checkpointed + "-lora" * self.lora
        return f"{self.preset}-{plan}x{self.dp}-mb{self.micro_batch}x{self.accum}-{size}{suffix}"


CASES = (
    Case("resnet-50", "ddp", 0, 2, 64, 1, image_size=224),
    Case("resnet-50", "fsdp2", 3, 2, 128, 2, image_size=224),
    Case("resnet-50", "fsdp2", 2, 2, 256, 1, image_size=224),
    Case("convnext-base", "ddp", 0, 2, 32, 1, image_size=224),
    Case("convnext-base", "fsdp2", 2, 4, 32, 2, image_size=288),
    Case("vit-large", "fsdp2", 3, 4, 32, 2, image_size=224),
    Case("vit-large", "ddp", 0, 2, 32, 1, image_size=384),
    Case("bert-large", "fsdp2", 2, 2, 32, 1, seq_len=512),
    Case("bert-large", "ddp", 0, 2, 32, 2, seq_len=256),
    Case("vit-large", "fsdp2", 3, 4, 64, 1, image_size=224, checkpointed=True),
    Case("vit-large", "ddp", 0, 2, 32, 2, image_size=384, checkpointed=True),
    Case("bert-large", "fsdp2", 2, 2, 64, 1, seq_len=512, checkpointed=True),
    Case("vit-large", "fsdp2", 3, 4, 32, 2, image_size=224, lora=True),
    Case("bert-large", "ddp", 0, 2, 32, 1, seq_len=512, lora=True),
)


def classifier_plan(backend: str, zero_stage: int, dp: int, micro_batch_size: int, checkpointed: bool = False) -> Plan:
    """A data-parallel plan as the search lays one out for a classifier (DDP replicates, the others shard)."""
    shard = backend != "ddp"
    return Plan(
        backend=backend, zero_stage=zero_stage, grad_reduce=DEFAULT_GRAD_REDUCE[backend],
        dp_replicate=1 if shard else dp, dp_shard=dp if shard else 1, tp=1, pp=1, pp_schedule="1f1b",
        activation_checkpointing="full" if checkpointed else "none", micro_batch_size=micro_batch_size,
        offload_optimizer=False, offload_params=False, options=option_defaults(),
    )  # fmt: skip


def run_case(case: Case) -> tuple[int, int]:
    """(predicted tensor bytes, simulated peak bytes) of rank 0."""
    config = load_model_config(case.preset)
    if case.image_size and "image_size" in config:  # a ViT's position table is sized for its image size
        config = load_model_config({**config, "image_size": case.image_size})
    plan = classifier_plan(case.backend, case.zero_stage, case.dp, case.micro_batch, case.checkpointed)
    task = "image-classification" if case.image_size else "sequence-classification"
    workload = Workload(
        seq_len=max(case.seq_len, 1),
        global_batch_size=case.micro_batch * case.dp * case.accum,
        image_size=case.image_size,
        method="lora" if case.lora else "full",
        job=job_facts(task_name=task),
    )
    predicted = classifier_model(config, workload).estimate_memory(plan, workload).total_bytes
    return predicted, simulate(config, plan, workload)["Total"]


def write_comparison(cases: Any, run: Any, results: Path, heading: list[str]) -> None:
    """Each case's (predicted, simulated) peak from ``run(case)``, printed as it comes, then the table with the
    largest and median error written to ``results`` under ``heading`` (its title and how it was run)."""
    rows, errors = [], []
    for case in cases:
        start = time.perf_counter()
        predicted, simulated = run(case)
        error = predicted / simulated - 1
        errors.append(abs(error))
        rows.append(
            f"| {case.name} | {predicted / 2**30:.2f} | {simulated / 2**30:.2f} | {error:+.1%} | "
            f"{time.perf_counter() - start:.0f} s |"
        )
        print(rows[-1], flush=True)
    text = "\n".join(
        [
            *heading,
            "",
            "| case | predicted GiB | simulated GiB | error | time |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"largest error {max(errors):.1%}, median {statistics.median(errors):.1%} ({len(cases)} cases).",
            "",
        ]
    )
    results.write_text(text)
    print(text.splitlines()[-1])


def main() -> None:
    write_comparison(
        CASES,
        run_case,
        RESULTS,
        [
            "# Classifier planner: predicted vs simulated peak (rank 0, bf16)",
            "",
            "`python bench/classifier_memory.py` (this machine: 2 CPU cores; fake tensors, fake process group).",
        ],
    )


if __name__ == "__main__":
    sys.exit(main())
