"""A diffusion transformer's planned peak memory against bigtrain's own flow-matching step simulated on fake tensors.

FLUX.1-dev's width (3072: 24 heads of 128, T5's 4096-wide text states, 64 packed latent channels) cut in depth to a
third of its blocks double-stream and two thirds single-stream, as FLUX.1-dev's 19 and 38; 512 px images (1024
image tokens) with 512 text tokens; rank 0 of 4 to 8, bf16; FSDP2 (zero_stage 3 with accumulation, zero_stage 2,
every block checkpointed) trained fully, LoRA on FSDP2 and on DDP. The VAE and text encoders are cached in the data:
no term of either. tests/distributed/test_diffusion_memory.py holds each case within 10%.

    python bench/diffusion_memory.py            # writes bench/results/diffusion_memory.md

What the planner's terms had to learn from FLUX (``planner/classifier_plan.py``, ``classifier_stats.py``): its
backward starts among the small single-stream blocks, and reaches the double-stream ones, twice their size, only
after most activations are released; the default LoRA adapts the attention projections only, so backward keeps
less than a fully trained step's activations; backward's own temporaries (the activations' gradients, attention's
fp32 accumulators) are a tenth of a 3-block step's peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from classifier_memory import classifier_plan, write_comparison

from bigtrain.config.workload import Workload
from bigtrain.job import job_facts
from bigtrain.measure.simulate import simulate
from bigtrain.planner.model_stats import load_model_config
from bigtrain.tasks import task

RESULTS = Path(__file__).parent / "results" / "diffusion_memory.md"
IMAGE_SIZE = 512


@dataclass(frozen=True)
class Case:
    preset: str
    layers: int  # every block, a third of them double-stream
    backend: str
    zero_stage: int
    dp: int
    micro_batch: int  # images
    accum: int
    seq_len: int  # text tokens
    checkpointed: bool = False  # full activation checkpointing of every block
    lora: bool = False

    @property
    def name(self) -> str:
        plan = self.backend if self.backend == "ddp" else f"{self.backend}-z{self.zero_stage}"
        suffix = "-ac" * self.checkpointed + "-lora" * self.lora
        return (
            f"{self.preset}/{self.layers}L-{plan}x{self.dp}-mb{self.micro_batch}x{self.accum}-L{self.seq_len}{suffix}"
        )


CASES = (
    Case("flux.1-dev", 6, "fsdp2", 3, 8, 2, 2, 512),
    Case("flux.1-dev", 6, "fsdp2", 2, 4, 1, 1, 512),
    Case("flux.1-dev", 3, "ddp", 0, 4, 2, 1, 512, lora=True),
    Case("flux.1-dev", 6, "fsdp2", 3, 4, 4, 1, 512, checkpointed=True),
    Case("flux.1-dev", 6, "fsdp2", 3, 4, 2, 1, 512, lora=True),
)


def trimmed(preset: str, layers: int | None) -> dict:
    """The preset's config dict with ``layers`` blocks, a third of them double-stream (FLUX.1-dev: 19 and 38)."""
    config = load_model_config(preset)
    if layers:
        init = {**config["init"], "num_layers": layers // 3, "num_single_layers": layers - layers // 3}
        config = load_model_config({**config, "init": init})
    return config


def run_case(case: Case) -> tuple[int, int]:
    """(predicted tensor bytes, simulated peak bytes) of rank 0."""
    spec = task("text-to-image")
    config = trimmed(case.preset, case.layers)
    plan = classifier_plan(case.backend, case.zero_stage, case.dp, case.micro_batch, case.checkpointed)
    workload = Workload(
        seq_len=case.seq_len,
        image_size=IMAGE_SIZE,
        global_batch_size=case.micro_batch * case.dp * case.accum,
        method="lora" if case.lora else "full",
        mixed_precision="bf16",
        job=job_facts("flow-matching", "text-to-image"),
    )
    predicted = spec.planner(config, workload).estimate_memory(plan, workload).total_bytes
    simulated = simulate(config, plan, workload)["Total"]
    return predicted, simulated


def main() -> None:
    write_comparison(
        CASES,
        run_case,
        RESULTS,
        [
            "# Diffusion transformer: planned vs simulated peak (rank 0, bf16)",
            "",
            "`python bench/diffusion_memory.py` (this machine: 2 CPU cores; fake tensors, fake process group). mb",
            f"counts images ({IMAGE_SIZE} px: 1024 image tokens) with 512 text tokens each.",
        ],
    )


if __name__ == "__main__":
    main()
