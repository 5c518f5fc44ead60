"""Analytic peak memory vs the simulated peak of preference plans (dpo with each reference, orpo) at Llama-3-8B's width.

    python bench/preference_memory.py        # prints the Markdown table recorded in bench/results/preference_memory.md

2 blocks of Llama-3-8B, FSDP2 on 8 ranks, bf16, rows of 512-1024 tokens; rank 0's step on fake tensors (bigtrain's
own step, with its reference). tests/distributed/test_preference_memory.py asserts each within 10%. On this CPU the
offloaded copy's shards cannot leave the device (there is none): the simulator leaves them out of the count, as a
GPU's memory would not hold them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import MemoryCase  # noqa: E402
from memory_matrix import run_case  # noqa: E402

# dpo and orpo at Llama-3-8B's width (2 blocks) on 8 GPUs under FSDP2: each reference, with LoRA and in full
PREFERENCE_MEMORY_CASES = [
    MemoryCase("llama-3-8b/2L", "fsdp2", 3, 8, "full", 1, 1024, 16, "bf16", objective="dpo", reference="sharded"),
    MemoryCase("llama-3-8b/2L", "fsdp2", 3, 8, "full", 1, 1024, 16, "bf16", objective="dpo", reference="offloaded"),
    MemoryCase("llama-3-8b/2L", "fsdp2", 3, 8, "full", 1, 1024, 16, "bf16", objective="dpo", reference="precomputed"),
    MemoryCase("llama-3-8b/2L", "fsdp2", 2, 8, "none", 1, 512, 16, "bf16", objective="dpo", reference="sharded"),
    MemoryCase(
        "llama-3-8b/2L", "fsdp2", 3, 8, "full", 1, 1024, 16, "bf16", method="lora", objective="dpo",
        reference="adapter_disabled",
    ),
    MemoryCase(
        "llama-3-8b/2L", "fsdp2", 3, 8, "full", 2, 1024, 32, "bf16", method="lora", objective="dpo",
        reference="precomputed",
    ),
    MemoryCase("llama-3-8b/2L", "fsdp2", 3, 8, "full", 1, 1024, 16, "bf16", objective="orpo"),
]  # fmt: skip


def main() -> int:
    print(
        "| objective | reference | method | plan | ac | mb (pairs) | rows of | predicted GiB | simulated GiB | error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    start, worst = time.perf_counter(), 0.0
    for c in PREFERENCE_MEMORY_CASES:
        predicted, simulated = run_case(c)
        err = predicted / simulated - 1
        worst = max(worst, abs(err))
        reference = c.reference if c.objective in ("dpo", "ipo") else "none"
        print(
            f"| {c.objective} | {reference} | {c.method} | fsdp2 zero{c.zero_stage} N{c.world} | {c.ac} | "
            f"{c.micro_batch} | {c.seq_len} | {predicted / 2**30:.2f} | {simulated / 2**30:.2f} | {err:+.1%} |"
        )
    print(f"\nworst {worst:.1%} over {len(PREFERENCE_MEMORY_CASES)} cases ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
