"""The embedding model's planned peak memory against bigtrain's own contrastive step simulated on fake tensors.

An embedding model is its family's base model trained with in-batch negatives through a gradient cache: every
micro-batch embedded without a graph first, every rank's embeddings scored together, then each micro-batch's
forward with a graph backpropagating its rows' cached gradients (``planner/embedding_plan.py``). Real widths:
e5-mistral-7b's (a 7 B decoder embedder, last-token pooling) cut in depth, FSDP2 (zero_stage 3 with accumulation,
zero_stage 2 with LoRA); ModernBERT-large whole on DDP; rank 0 of 2 to 8, bf16, an anchor and its positive per
example.

    python bench/embedding_memory.py            # writes bench/results/embedding_memory.md
"""

from __future__ import annotations

from pathlib import Path

from classifier_memory import classifier_plan, write_comparison
from reward_memory import Case

from bigtrain.config.workload import Workload
from bigtrain.job import job_facts
from bigtrain.measure.simulate import simulate
from bigtrain.planner.model_stats import load_model_config
from bigtrain.tasks import task

RESULTS = Path(__file__).parent / "results" / "embedding_memory.md"


# a case as the reward model's bench names one (mb counts examples here: an anchor and its positive, two rows each)
CASES = (
    Case("e5-mistral-7b", 4, "fsdp2", 3, 8, 4, 2, 512),
    Case("e5-mistral-7b", 4, "fsdp2", 2, 4, 8, 1, 512, lora=True),
    Case("modernbert-large", None, "ddp", 0, 2, 16, 2, 512),
)


def run_case(case: Case) -> tuple[int, int]:
    """(predicted tensor bytes, simulated peak bytes) of rank 0."""
    spec = task("embedding")
    config = load_model_config(case.preset)
    if case.layers:
        config = load_model_config({**config, "num_hidden_layers": case.layers})
    plan = classifier_plan(case.backend, case.zero_stage, case.dp, case.micro_batch)
    workload = Workload(
        seq_len=case.seq_len,
        global_batch_size=case.micro_batch * case.dp * case.accum,
        method="lora" if case.lora else "full",
        mixed_precision="bf16",
        job=job_facts("contrastive", "embedding"),
    )
    predicted = spec.planner(config, workload).estimate_memory(plan, workload).total_bytes
    # the model start-up builds: the family's base model (its token states, no head)
    built = {k: v for k, v in config.items() if k not in ("architectures", "id2label", "label2id", "num_labels")}
    simulated = simulate({**built, "architectures": [spec.class_name(config["model_type"])]}, plan, workload)["Total"]
    return predicted, simulated


def main() -> None:
    write_comparison(
        CASES,
        run_case,
        RESULTS,
        [
            "# Embedding model: planned vs simulated peak (rank 0, bf16)",
            "",
            "`python bench/embedding_memory.py` (this machine: 2 CPU cores; fake tensors, fake process group). mb",
            "counts examples (an anchor and its positive: two rows each).",
        ],
    )


if __name__ == "__main__":
    main()
