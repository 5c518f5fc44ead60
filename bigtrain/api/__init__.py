"""bigtrain as a plugin in your own script: plan, then hand the plan to HF Trainer, TRL, accelerate or DeepSpeed.

    import bigtrain
    result = bigtrain.plan("path/to/hf_model", gpus=8, gpu="H100", seq_len=4096, global_batch_size=64)
    print(result.explain())                        # the table bigtrain plan prints
    args = result.to_training_arguments(output_dir="out")      # transformers.TrainingArguments
    trainer = Trainer(model, args, ..., callbacks=[bigtrain.MemoryCheckCallback(result)])

What ``import bigtrain`` exposes is this package's ``__all__``; the rest of bigtrain is internal. Each name is
loaded on first use (the memory check pulls in transformers' Trainer callbacks, which ``bigtrain train`` and
``bigtrain plan`` do not need).
"""

from importlib import import_module
from typing import Any

_HOME = {
    "ConfigError": "bigtrain.errors",
    "MemoryCheck": "bigtrain.api.memory_check",
    "MemoryCheckCallback": "bigtrain.api.memory_check",
    "check_memory": "bigtrain.api.memory_check",
    "PlanResult": "bigtrain.api.result",
    "RankedPlan": "bigtrain.api.result",
    "plan": "bigtrain.api.planning",
    "recipe_plan": "bigtrain.api.planning",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(import_module(_HOME[name]), name)
    raise AttributeError(f"module 'bigtrain.api' has no attribute {name!r}")
