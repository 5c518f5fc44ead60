"""grpo's two phases, planned against bigtrain's own step simulated on fake tensors: the rollout (prefill and the last
decode step on the policy's engine, ``bigtrain/measure/generation_step.py``) and the training step after it.

Real widths cut in depth (the per-layer terms repeat), 8 ranks, bf16: FSDP2 ZeRO-3 and ZeRO-2, DDP, LoRA, QLoRA
and a sharded reference (beta > 0), with rollouts whose peak is the prefill (many prompt tokens), the last decode step
(long completions: the KV cache) or the gathering of the first units (short ones).

    python bench/rollout_memory.py            # writes bench/results/rollout_memory.md
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cases import MemoryCase, arch_config  # noqa: E402

from bigtrain.config.workload import Generation, Workload  # noqa: E402
from bigtrain.job import job_facts  # noqa: E402
from bigtrain.measure.simulate import simulate  # noqa: E402
from bigtrain.planner.memory import estimate_memory  # noqa: E402
from bigtrain.planner.model_stats import ModelStats  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "rollout_memory.md"


@dataclasses.dataclass(frozen=True)
class RolloutCase:
    arch: str
    backend: str
    zero_stage: int
    method: str
    global_batch: int  # completions per step (8 ranks: global_batch / 8 each)
    prompt: int
    completion: int
    reference: str = "none"  # sharded: beta > 0 with a frozen copy

    @property
    def name(self) -> str:
        ref = f"-ref-{self.reference}" if self.reference != "none" else ""
        return (
            f"{self.method}-{self.arch}-{self.backend}{self.zero_stage}-B{self.global_batch}-P{self.prompt}-"
            f"C{self.completion}{ref}"
        )

    def memory_case(self) -> MemoryCase:
        return MemoryCase(
            self.arch, self.backend, self.zero_stage, 8, "full", 1, self.prompt + self.completion, self.global_batch,
            "bf16", method=self.method, objective="grpo",
            reference=self.reference if self.reference != "none" else "auto",
        )  # fmt: skip

    def workload(self) -> Workload:
        facts = job_facts("grpo")
        roles = facts.roles if self.reference != "none" else ()
        base = self.memory_case().workload()
        return dataclasses.replace(
            base, generation=Generation(self.prompt, self.completion), job=dataclasses.replace(facts, roles=roles)
        )


L1B, L8B, Q7B = "llama-3.2-1b/4L", "llama-3-8b/2L", "qwen2.5-7b/2L"
ROLLOUT_MEMORY_CASES = [
    RolloutCase(L1B, "fsdp2", 3, "full", 512, 512, 1536),  # the prefill's MLP over 64 x 512 prompt tokens
    RolloutCase(L1B, "fsdp2", 3, "full", 256, 64, 8192),  # the last decode step: a 2 GiB KV cache
    RolloutCase(L1B, "fsdp2", 3, "full", 64, 128, 512),  # short: gathering the root unit
    RolloutCase(L1B, "fsdp2", 2, "full", 256, 64, 8192),  # ZeRO-2 mode keeps every block gathered
    RolloutCase(L1B, "ddp", 0, "full", 64, 256, 2048),  # DDP: buckets and autocast's weight copies
    RolloutCase(L8B, "fsdp2", 3, "full", 128, 256, 4096),
    RolloutCase(L8B, "fsdp2", 3, "lora", 256, 256, 4096),
    RolloutCase(L8B, "fsdp2", 3, "full", 128, 256, 4096, reference="sharded"),
    RolloutCase(Q7B, "fsdp2", 3, "full", 256, 512, 2048),
    RolloutCase(L8B, "fsdp2", 3, "qlora", 256, 256, 4096),  # NF4 blocks gathered 4-bit
    RolloutCase(L1B, "ddp", 0, "lora", 64, 256, 2048),  # a frozen bf16 base: no casts, no buckets to speak of
    RolloutCase(L1B, "fsdp2", 2, "lora", 256, 64, 8192),
]


def run_case(case: RolloutCase) -> dict[str, int]:
    """Predicted and simulated bytes of each phase: generation, training, and the step's peak."""
    config = arch_config(case.arch)
    plan, workload = case.memory_case().plan(), case.workload()
    predicted = estimate_memory(ModelStats.from_config(config), plan, workload)
    phases = dict(predicted.phases)
    simulated = simulate(config, plan, workload)
    return {
        "predicted_generation": phases["generation"],
        "predicted_training": phases["training"],
        "predicted": predicted.total_bytes,
        "simulated_generation": simulated["Generation"],
        "simulated_training": simulated["Training"],
        "simulated": simulated["Total"],
    }


def main() -> int:
    lines = [
        "| case | rollout predicted GiB | simulated | error | training predicted GiB | simulated | error |",
        "|---|---|---|---|---|---|---|",
    ]
    start, worst = time.perf_counter(), 0.0
    for case in ROLLOUT_MEMORY_CASES:
        r = run_case(case)
        cells = [case.name]
        for phase in ("generation", "training"):
            p, s = r[f"predicted_{phase}"], r[f"simulated_{phase}"]
            worst = max(worst, abs(p / s - 1))
            cells += [f"{p / 2**30:.2f}", f"{s / 2**30:.2f}", f"{p / s - 1:+.1%}"]
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    lines.append(
        f"\nworst |error| {worst:.1%} over {len(ROLLOUT_MEMORY_CASES)} cases ({time.perf_counter() - start:.0f} s)"
    )
    print(lines[-1])
    RESULTS.write_text(
        "# grpo's rollout and training phases: planned against the simulated step\n\n"
        "`python bench/rollout_memory.py` (8 ranks, bf16, real widths cut in depth; rank 0 on fake tensors)\n\n"
        + "\n".join(lines)
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
