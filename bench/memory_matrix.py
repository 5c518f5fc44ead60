"""Analytic peak memory vs the simulated peak (bigtrain's own step on fake tensors, rank 0 of an N-rank job).

    python bench/memory_matrix.py            # prints the Markdown table recorded in README.md

The same CASES are asserted (within 10%) by tests/distributed/test_memory_matrix.py.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from bigtrain.plan.memory import estimate_memory
from bigtrain.plan.model_stats import ModelStats, load_model_config
from bigtrain.plan.plan import Plan
from bigtrain.plan.simulate import simulate

ARCHS = {
    # dense multi-head attention (kv heads = heads), untied
    "llama-dense": dict(
        model_type="llama",
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        vocab_size=8000,
        tie_word_embeddings=False,
    ),
    # grouped-query attention (4 query heads per KV head)
    "mistral-gqa": dict(
        model_type="mistral",
        hidden_size=512,
        intermediate_size=1792,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=8000,
    ),
    # tied embeddings, q/k/v biases
    "qwen2-tied": dict(
        model_type="qwen2",
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=16000,
        tie_word_embeddings=True,
    ),
    # Qwen2.5's 152k vocabulary on a small body: the logits dominate
    "qwen2-bigvocab": dict(
        model_type="qwen2",
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}


@dataclass(frozen=True)
class Case:
    arch: str
    backend: str
    zero_stage: int
    world: int
    ac: str
    micro_batch: int
    seq_len: int
    global_batch: int
    precision: str

    def plan(self) -> Plan:
        replicate, shard = (self.world, 1) if self.backend == "ddp" else (1, self.world)
        return Plan(
            self.backend, self.zero_stage, replicate, shard, 1, 1, "1f1b", self.ac, self.micro_batch, False, False
        )


CASES = [
    Case("llama-dense", "fsdp2", 3, 8, "none", 2, 512, 16, "bf16"),
    Case("llama-dense", "fsdp2", 2, 8, "none", 1, 1024, 16, "bf16"),
    Case("llama-dense", "ddp", 0, 8, "none", 1, 512, 16, "fp32"),
    Case("llama-dense", "fsdp2", 3, 64, "full", 4, 512, 512, "bf16"),
    Case("mistral-gqa", "fsdp2", 3, 8, "full", 2, 1024, 32, "bf16"),
    Case("mistral-gqa", "ddp", 0, 8, "none", 2, 256, 32, "bf16"),
    Case("mistral-gqa", "fsdp2", 2, 64, "none", 1, 2048, 64, "fp32"),
    Case("qwen2-tied", "fsdp2", 3, 8, "none", 4, 256, 32, "fp32"),
    Case("qwen2-tied", "ddp", 0, 8, "full", 2, 512, 16, "bf16"),
    Case("qwen2-tied", "fsdp2", 2, 8, "full", 8, 256, 64, "bf16"),
    Case("qwen2-bigvocab", "fsdp2", 3, 8, "none", 1, 512, 8, "bf16"),
    Case("qwen2-bigvocab", "ddp", 0, 8, "none", 2, 256, 32, "fp32"),
    Case("qwen2-bigvocab", "fsdp2", 2, 64, "full", 2, 1024, 128, "bf16"),
]


def run_case(case: Case) -> tuple[int, int]:
    """(predicted peak bytes, simulated peak bytes)."""
    config = load_model_config(ARCHS[case.arch])
    stats = ModelStats.from_config(config)
    predicted = estimate_memory(stats, case.plan(), case.seq_len, case.precision, case.global_batch).total_bytes
    simulated = simulate(config, case.plan(), case.seq_len, case.precision, case.global_batch)["Total"]
    return predicted, simulated


def main() -> int:
    print("| model | plan | N | ac | mb | seq | batch | dtype | predicted MiB | simulated MiB | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    start = time.perf_counter()
    for c in CASES:
        predicted, simulated = run_case(c)
        err = predicted / simulated - 1
        worst = max(worst, abs(err))
        plan = "ddp" if c.backend == "ddp" else f"fsdp2 zero{c.zero_stage}"
        print(
            f"| {c.arch} | {plan} | {c.world} | {c.ac} | {c.micro_batch} | {c.seq_len} | {c.global_batch} | "
            f"{c.precision} | {predicted / 2**20:,.1f} | {simulated / 2**20:,.1f} | {err:+.1%} |",
            flush=True,
        )
    print(f"\nworst |error| {worst:.1%} over {len(CASES)} cases in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
