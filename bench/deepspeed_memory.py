"""The planner's DeepSpeed ZeRO memory terms against DeepSpeed's real step, on CPU gloo ranks.

    torchrun --nproc-per-node 2 bench/deepspeed_memory.py     # prints the Markdown table of bench/results/

Every rank builds bigtrain's DeepSpeed engine (``deepspeed.initialize`` with the ZeRO stage's template) for each
case, runs one training step to create the optimizer states, then a second step whose peak of live tensor bytes is
measured: every tensor storage an operator creates is counted from its creation until it is freed (a dispatch mode
sees each operator, weak references see each free), from before ``deepspeed.initialize`` on, so DeepSpeed's flat
parameter buffers, fp32 partitions, gradient partitions and reduction buckets are all in it. The reported peak is the
largest of the ranks'. fp32 only (this host's DeepSpeed CPU accelerator), and no offload cases: on a CPU the host
memory ZeRO-Offload moves the optimizer to is the memory being measured.
"""

from __future__ import annotations

import gc
import json
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of tensor storage alive now and at the peak, for every storage an operator created inside the mode."""

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._seen: dict[int, weakref.ref] = {}

    def _freed(self, key: int, nbytes: int) -> None:
        self._seen.pop(key, None)
        self.current -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = id(storage)
            if key in self._seen and self._seen[key]() is storage:
                continue
            nbytes = storage.nbytes()
            self._seen[key] = weakref.ref(storage, lambda _, k=key, n=nbytes: self._freed(k, n))
            self.current += nbytes
        self.peak = max(self.peak, self.current)
        return out

    def reset_peak(self) -> None:
        self.peak = self.current


@dataclass(frozen=True)
class DeepSpeedCase:
    zero_stage: int
    micro_batch_size: int
    accum: int = 1  # micro-steps per optimizer step (the global batch follows from the ranks)
    hidden: int = 256
    layers: int = 4
    vocab: int = 2048
    seq_len: int = 128
    activation_checkpointing: str = "none"

    def model_config(self) -> dict[str, Any]:
        return {
            "model_type": "llama",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": 3 * self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.hidden // 64,
            "num_key_value_heads": self.hidden // 128,
            "max_position_embeddings": self.seq_len,
            "tie_word_embeddings": False,
        }


CASES = [
    DeepSpeedCase(zero_stage=1, micro_batch_size=2),
    DeepSpeedCase(zero_stage=2, micro_batch_size=2),
    DeepSpeedCase(zero_stage=2, micro_batch_size=2, accum=2),
    DeepSpeedCase(zero_stage=3, micro_batch_size=2),
    DeepSpeedCase(zero_stage=3, micro_batch_size=2, accum=2, activation_checkpointing="full"),
    DeepSpeedCase(zero_stage=1, micro_batch_size=1, hidden=512, layers=2, vocab=8192),
    DeepSpeedCase(zero_stage=2, micro_batch_size=1, hidden=512, layers=2, vocab=8192),
    DeepSpeedCase(zero_stage=3, micro_batch_size=1, hidden=512, layers=2, vocab=8192),
]


def measure(case: DeepSpeedCase) -> dict[str, Any]:
    """This rank's measured peak and the planner's prediction for ``case`` (call on every rank)."""
    from bigtrain.config.hf import hf_config_from_dict
    from bigtrain.config.resolve import resolve_plan
    from bigtrain.config.schema import ModelConfig, ParallelConfig, RecipeConfig, TrainConfig
    from bigtrain.config.workload import Workload
    from bigtrain.data.batch import MicroBatch
    from bigtrain.engine import build_engine, build_options
    from bigtrain.job import named_job
    from bigtrain.planner.memory import estimate_memory
    from bigtrain.planner.model_stats import ModelStats
    from bigtrain.train.loop import train_step
    from bigtrain.train.optim import build_optimizer, build_scheduler

    world = dist.get_world_size()
    global_batch = case.micro_batch_size * world * case.accum
    cfg = RecipeConfig(
        model=ModelConfig(config=case.model_config()),
        train=TrainConfig(global_batch_size=global_batch, mixed_precision="fp32"),
        parallel=ParallelConfig(
            backend="deepspeed",
            zero_stage=case.zero_stage,
            micro_batch_size=case.micro_batch_size,
            activation_checkpointing=case.activation_checkpointing,
        ),
    )
    plan = resolve_plan(cfg.parallel, world, cfg.train)
    hf_config = hf_config_from_dict(case.model_config(), key="model.config")
    accum = plan.grad_accum_steps(global_batch)
    gen = torch.Generator().manual_seed(dist.get_rank())
    tokens = float(global_batch * (case.seq_len - 1))
    with LiveTensorBytes() as live:
        engine = build_engine(
            build_options(cfg, hf_config, plan, torch.device("cpu")),
            cfg.train,
            lambda params: build_optimizer(params, cfg.train),
            lambda optimizer: build_scheduler(optimizer, cfg.train),
            objective=named_job().objective.make,  # a causal LM's next-token loss
        )
        batches = [
            MicroBatch.of_ids(torch.randint(0, case.vocab, (case.micro_batch_size, case.seq_len), generator=gen))
            for _ in range(accum)
        ]
        train_step(engine, batches, tokens, cfg.train.grad_clip)  # creates the optimizer states
        live.reset_peak()
        train_step(engine, batches, tokens, cfg.train.grad_clip)
        peak = torch.tensor([live.peak], dtype=torch.int64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    stats = ModelStats.from_config(case.model_config())
    workload = Workload(seq_len=case.seq_len, global_batch_size=global_batch, mixed_precision="fp32")
    predicted = estimate_memory(stats, plan, workload)
    del engine
    gc.collect()
    return {"measured": int(peak.item()), "predicted": predicted.total_bytes, "accum": accum, "world": world}


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    only = [int(i) for i in sys.argv[1:]] or range(len(CASES))
    if rank == 0:
        print("| ZeRO | ranks | h | layers | vocab | mb | seq | accum | ac | predicted MiB | measured MiB | error |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for i in only:
        c = CASES[i]
        r = measure(c)
        err = r["predicted"] / r["measured"] - 1
        worst = max(worst, abs(err))
        if rank == 0:
            row = [c.zero_stage, r["world"], c.hidden, c.layers, c.vocab, c.micro_batch_size, c.seq_len, r["accum"]]
            row += [c.activation_checkpointing, f"{r['predicted'] / 2**20:.1f}", f"{r['measured'] / 2**20:.1f}"]
            print("| " + " | ".join(map(str, row)) + f" | {err:+.1%} |", flush=True)
            print(json.dumps({"case": i, **r}), file=sys.stderr, flush=True)
    if rank == 0:
        print(f"\nworst |error|: {worst:.1%}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
