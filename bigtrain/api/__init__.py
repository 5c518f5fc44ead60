"""bigtrain as a plugin in your own script: plan, then hand the plan to HF Trainer, TRL, accelerate or DeepSpeed.

    import bigtrain
    result = bigtrain.plan("path/to/hf_model", gpus=8, gpu="H100", seq_len=4096, global_batch_size=64)
    print(result.explain())                        # the table bigtrain plan prints
    args = result.to_training_arguments(output_dir="out")      # transformers.TrainingArguments
    trainer = Trainer(model, args, ..., callbacks=[bigtrain.MemoryCheckCallback(result)])

What ``import bigtrain`` exposes is this package's ``__all__``; the rest of bigtrain is internal.
"""

from bigtrain.api.memory_check import MemoryCheck, MemoryCheckCallback, check_memory
from bigtrain.api.planning import plan, recipe_plan
from bigtrain.api.result import PlanResult, RankedPlan
from bigtrain.errors import ConfigError

__all__ = [
    "ConfigError",
    "MemoryCheck",
    "MemoryCheckCallback",
    "PlanResult",
    "RankedPlan",
    "check_memory",
    "plan",
    "recipe_plan",
]
