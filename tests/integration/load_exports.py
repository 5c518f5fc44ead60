"""Load exported files with each target library's own parser and print what it read, one JSON line per file.

    python load_exports.py TARGET:WORLD_SIZE:PATH ...

A separate process on purpose: ``TrainingArguments`` with a DeepSpeed config registers a process-wide
``HfDeepSpeedConfig`` (every later ``from_pretrained`` would build ZeRO-3-partitioned models), and DeepSpeed's config
checks the batch against the world size of an initialised process group, here a fake one per file.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch


def load_accelerate(path: str) -> dict[str, Any]:
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(path)
    return {
        "distributed_type": str(cfg.distributed_type),
        "num_processes": cfg.num_processes,
        "num_machines": cfg.num_machines,
        "mixed_precision": str(cfg.mixed_precision),
        "fsdp_config": cfg.fsdp_config,
        "deepspeed_config": cfg.deepspeed_config,
        "parallelism_config": cfg.parallelism_config,
    }


def load_deepspeed(path: str, world_size: int) -> dict[str, Any]:
    import deepspeed
    import torch.distributed as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        deepspeed.init_distributed()
        with open(path) as f:
            cfg = DeepSpeedConfig(json.load(f))  # asserts batch = micro x accumulation x world
        return {
            "world_size": cfg.world_size,
            "train_batch_size": cfg.train_batch_size,
            "micro": cfg.train_micro_batch_size_per_gpu,
            "accumulation": cfg.gradient_accumulation_steps,
            "stage": int(cfg.zero_optimization_stage),
            "offload_optimizer": cfg.zero_config.offload_optimizer is not None
            and str(cfg.zero_config.offload_optimizer.device) != "none",
            "bf16": cfg.bfloat16_config.enabled,
            "clip": cfg.gradient_clipping,
        }
    finally:
        dist.destroy_process_group()


def load_hf_trainer(path: str) -> dict[str, Any]:
    from transformers import TrainingArguments

    with open(path) as f:
        kwargs = json.load(f)
    if "parallelism_config" in kwargs:
        from accelerate.parallelism_config import ParallelismConfig

        kwargs["parallelism_config"] = ParallelismConfig(**kwargs["parallelism_config"])
    if kwargs.get("bf16") and not torch.cuda.is_available():
        kwargs["use_cpu"] = True  # this reader runs on a CPU machine; the Trainer refuses bf16 there otherwise
    args = TrainingArguments(**kwargs)
    out: dict[str, Any] = {
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "max_grad_norm": args.max_grad_norm,
        "lr_scheduler_type": str(args.lr_scheduler_type),
        "fsdp": bool(args.fsdp),
        "fsdp_plugin_args": getattr(args, "fsdp_plugin_args", None),
        "deepspeed_stage": None,
        "tp_size": args.parallelism_config.tp_size if args.parallelism_config else None,
    }
    if args.deepspeed_plugin is not None:
        out["deepspeed_stage"] = args.deepspeed_plugin.zero_stage
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
    return out


def main() -> None:
    for item in sys.argv[1:]:
        target, world, path = item.split(":", 2)
        if target == "accelerate":
            read = load_accelerate(path)
        elif target == "deepspeed":
            read = load_deepspeed(path, int(world))
        else:
            read = load_hf_trainer(path)
        print(json.dumps({"file": path, "target": target, "read": read}, default=str), flush=True)


if __name__ == "__main__":
    main()
