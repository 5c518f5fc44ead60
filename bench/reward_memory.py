"""The reward model's planned peak memory against bigtrain's own training step simulated on fake tensors.

A reward model is a causal LM's body with a one-output score head, planned as a classifier of pairs (two rows each).
Real widths cut in depth (the per-block terms repeat), FSDP2 (zero_stage 2 and 3, with accumulation) and DDP, full
training and LoRA, rank 0 of 2 to 8, bf16. A large vocabulary's embedding (Llama-3's 128k) outweighs a block: FSDP2
then holds it gathered beside the blocks, which the classifier's terms model.

    python bench/reward_memory.py            # writes bench/results/reward_memory.md
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

RESULTS = Path(__file__).parent / "results" / "reward_memory.md"


@dataclass(frozen=True)
class Case:
    preset: str
    layers: int | None  # None: the preset's own depth
    backend: str
    zero_stage: int
    dp: int
    micro_batch: int  # pairs (two rows each)
    accum: int
    seq_len: int
    lora: bool = False

    @property
    def name(self) -> str:
        depth = f"/{self.layers}L" if self.layers else ""
        plan = self.backend if self.backend == "ddp" else f"{self.backend}-z{self.zero_stage}"
        lora = "-lora" if self.lora else ""
        return f"{self.preset}{depth}-{plan}x{self.dp}-mb{self.micro_batch}x{self.accum}-L{self.seq_len}{lora}"


CASES = (
    Case("llama-3-8b", 8, "fsdp2", 3, 8, 2, 2, 1024),
    Case("mistral-7b", 8, "fsdp2", 3, 8, 2, 2, 2048),
    Case("llama-3-8b", 2, "fsdp2", 2, 4, 4, 1, 2048, lora=True),
    Case("qwen2.5-0.5b", None, "ddp", 0, 2, 4, 1, 1024),
)


def run_case(case: Case) -> tuple[int, int]:
    """(predicted tensor bytes, simulated peak bytes) of rank 0."""
    spec = task("reward-model")
    config = load_model_config(case.preset)
    if case.layers:
        config = load_model_config({**config, "num_hidden_layers": case.layers})
    plan = classifier_plan(case.backend, case.zero_stage, case.dp, case.micro_batch)
    workload = Workload(
        seq_len=case.seq_len,
        global_batch_size=case.micro_batch * case.dp * case.accum,
        method="lora" if case.lora else "full",
        mixed_precision="bf16",
        job=job_facts("reward", "reward-model"),
    )
    predicted = spec.planner(config, workload).estimate_memory(plan, workload).total_bytes
    # the model start-up builds: the family's sequence classifier, one output, a pad id to find each row's end
    built = {**config, "architectures": [spec.class_name(config["model_type"])], "id2label": {"0": "LABEL_0"}}
    simulated = simulate({**built, "pad_token_id": 0}, plan, workload)["Total"]
    return predicted, simulated


def main() -> None:
    write_comparison(
        CASES,
        run_case,
        RESULTS,
        [
            "# Reward model: planned vs simulated peak (rank 0, bf16)",
            "",
            "`python bench/reward_memory.py` (this machine: 2 CPU cores; fake tensors, fake process group). mb counts",
            "pairs (two rows each).",
        ],
    )


if __name__ == "__main__":
    main()
