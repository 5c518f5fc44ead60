"""Vision-language models: the planner's peak against bigtrain's own step simulated on fake tensors.

    python bench/vlm_memory.py            # prints the Markdown table recorded in bench/results/vlm_memory.md

The cases (tests/vlm_cases.py): Qwen2.5-VL-7B and Gemma-3-4B at their real widths, two decoder layers and two vision
blocks (and once each the whole tower), 1 to 4 images of 448 to 1024 pixels per row, full fine-tuning and LoRA, a
frozen tower, checkpointing, FSDP2 ZeRO-2/3 and DDP on 8 ranks. tests/distributed/test_vlm_memory.py asserts each
within 10%, the median within 5%.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from vlm_cases import VLM_MEMORY_CASES, VlmCase  # noqa: E402

from bigtrain.measure.simulate import simulate  # noqa: E402
from bigtrain.planner.memory import estimate_memory  # noqa: E402
from bigtrain.planner.model_stats import ModelStats  # noqa: E402

MiB = 2**20


def run_vlm_case(case: VlmCase) -> tuple[int, int]:
    """(predicted peak bytes, simulated peak bytes)."""
    config = case.config()
    predicted = estimate_memory(ModelStats.from_config(config), case.plan(), case.workload()).total_bytes
    return predicted, simulate(config, case.plan(), case.workload())["Total"]


def main() -> int:
    print("| case | image tokens per row | predicted MiB | simulated MiB | error |")
    print("|---|---|---|---|---|")
    errors = []
    start = time.perf_counter()
    for case in VLM_MEMORY_CASES:
        predicted, simulated = run_vlm_case(case)
        errors.append(predicted / simulated - 1)
        tokens = ModelStats.from_config(case.config()).vision.tokens(case.image_size) * case.images
        print(f"| {case.name} | {tokens:,} | {predicted / MiB:,.0f} | {simulated / MiB:,.0f} | {errors[-1]:+.1%} |")
    worst = max(errors, key=abs)
    median = statistics.median(abs(e) for e in errors)
    took = time.perf_counter() - start
    print(f"\n{len(errors)} cases, worst {worst:+.1%}, median |error| {median:.1%}, {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
