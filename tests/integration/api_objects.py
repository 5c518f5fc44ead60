"""Build every conversion of ``bigtrain.plan`` with its own library, on each rank of a gloo job of the plan's size,
and print what each library read back (rank 0, one JSON line).

    torchrun --nproc-per-node 2 tests/integration/api_objects.py

A separate process on purpose: ``TrainingArguments`` with a DeepSpeed config registers a process-wide
``HfDeepSpeedConfig``, and ``Accelerator`` keeps process-wide state. On CPUs accelerate runs ``MULTI_CPU`` (DDP):
the FSDP and DeepSpeed plugin objects are built and read back, but only a GPU job would run them.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch.distributed as dist

import bigtrain

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared model configs
from cases import TINY_LLAMA  # noqa: E402

PLANS = {  # ZeRO-3 first: its TrainingArguments make transformers build every later model partitioned, not bigtrain's
    "deepspeed_zero3_offload": {"backend": "deepspeed", "zero_stage": 3, "offload_optimizer": True},
    "ddp": {"backend": "ddp"},
    "fsdp2_zero3": {"backend": "fsdp2", "zero_stage": 3, "activation_checkpointing": "full"},
    "fsdp2_zero2": {"backend": "fsdp2", "zero_stage": 2, "offload_params": False},
    "deepspeed_zero2": {"backend": "deepspeed", "zero_stage": 2},
}


def read_back(result: Any, out_dir: str) -> dict[str, Any]:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from deepspeed.runtime.config import DeepSpeedConfig

    args = result.to_training_arguments(output_dir=out_dir, use_cpu=True)
    read: dict[str, Any] = {
        "plan": result.plan.to_dict(),
        "accumulation": result.gradient_accumulation_steps,
        "trainer": {
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "world_size": args.world_size,
            "fsdp": bool(args.fsdp),
            "reshard_after_forward": (args.fsdp_config or {}).get("reshard_after_forward"),
            "fsdp_activation_checkpointing": (args.fsdp_config or {}).get("activation_checkpointing"),
            "deepspeed_stage": args.hf_deepspeed_config.config["zero_optimization"]["stage"]
            if args.deepspeed
            else None,
            "bf16": args.bf16,
        },
    }
    sft = result.to_sft_config(output_dir=out_dir, use_cpu=True)
    read["sft"] = {"max_length": sft.max_length, "per_device_train_batch_size": sft.per_device_train_batch_size}
    accelerator = Accelerator(cpu=True, **result.to_accelerate())
    state = accelerator.state
    fsdp = getattr(state, "fsdp_plugin", None) or result.to_accelerate().get("fsdp_plugin")
    ds = getattr(state, "deepspeed_plugin", None) or result.to_accelerate().get("deepspeed_plugin")
    read["accelerate"] = {
        "num_processes": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type),
        "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
        "mixed_precision": str(accelerator.mixed_precision),
        "fsdp_version": getattr(fsdp, "fsdp_version", None),
        "fsdp_reshard_after_forward": getattr(fsdp, "reshard_after_forward", None),
        "fsdp_wrap": getattr(fsdp, "transformer_cls_names_to_wrap", None),
        "deepspeed_zero_stage": getattr(ds, "zero_stage", None),
        "deepspeed_offload_optimizer": getattr(ds, "offload_optimizer_device", None),
    }
    AcceleratorState._reset_state(reset_partial_state=False)
    if result.plan.backend == "deepspeed":
        config = DeepSpeedConfig(result.to_deepspeed())  # checks batch = micro x accumulation x this group's size
        read["deepspeed"] = {
            "world_size": config.world_size,
            "train_batch_size": config.train_batch_size,
            "stage": int(config.zero_optimization_stage),
        }
    return read


def main() -> None:
    import deepspeed

    dist.init_process_group("gloo")
    deepspeed.init_distributed(dist_backend="gloo")
    world = dist.get_world_size()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, fix in PLANS.items():
            result = bigtrain.plan(
                TINY_LLAMA, gpus=world, gpu_memory="8GB", seq_len=128, global_batch_size=16, fix={**fix, "micro_batch_size": 2}
            )
            out[name] = read_back(result, tmp)
    if dist.get_rank() == 0:
        print(json.dumps(out), file=sys.stdout, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
