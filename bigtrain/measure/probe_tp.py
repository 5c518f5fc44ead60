"""What tensor parallelism costs a decoder block beyond its matmuls, measured for ``bigtrain probe``.

Under tp every projection is a DTensor: each operator is dispatched through DTensor's sharding propagation, inputs
and outputs are wrapped and unwrapped, and the row-wise outputs wait on collectives. On a 2-core CPU that machinery
cost ~7-15 ms per block and micro-step (measured while building this), far above the cost of the operators
themselves: it is why tp=2 ran 1.8x slower than dp=2 on the quickstart (``bench/results/tp_vs_dp_cpu.md``) while the
time model had only the all-reduces' bandwidth.

The measurement: a tiny Llama (the trainer's own tensor-parallel transform) on a fake process group of two ranks,
whose collectives return at once, against the same model built at one rank's local widths (half the heads and
MLP units) without tp; the difference per block and micro-step is the machinery. The collectives' own time is
measured apart, over real ranks (``probe.collective_bandwidth``). Runs before the probe joins a real group: a fake
group is this process's only one while it measures.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

LAYERS, HIDDEN, TOKENS = 4, 64, 512


def _tiny_llama(heads: int, kv_heads: int, ffn: int, device: torch.device) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=HIDDEN, intermediate_size=ffn, num_hidden_layers=LAYERS,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=HIDDEN // 4, max_position_embeddings=TOKENS,
    )
    return LlamaForCausalLM(config).to(device)


def _step_seconds(model: torch.nn.Module, device: torch.device, repeats: int = 7) -> float:
    ids = torch.randint(0, 256, (2, TOKENS // 2), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for i in range(repeats + 2):
        sync()
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        sync()
        if i >= 2:  # the first steps build DTensor's sharding caches
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def tp_block_overhead(device: torch.device) -> dict[str, float]:
    """Seconds per decoder block and micro-step that tp=2 adds over the same local widths without tp, without and
    with sequence parallelism (``{"plain": s, "sequence_parallel": s}``); needs no other process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from bigtrain.parallel.transforms.tensor_parallel import apply_tensor_parallel

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh(device.type, (2,))
        local = _step_seconds(_tiny_llama(2, 1, 2 * HIDDEN, device), device)
        out: dict[str, Any] = {}
        for name, sequence_parallel in (("plain", False), ("sequence_parallel", True)):
            model = _tiny_llama(4, 2, 4 * HIDDEN, device)
            apply_tensor_parallel(model, model.config, mesh, False, sequence_parallel)
            out[name] = max(0.0, (_step_seconds(model, device) - local) / LAYERS)
        return out
    finally:
        dist.destroy_process_group()
        if device.type == "cuda":
            torch.cuda.set_device(device)  # the mesh may have made another device current; the real group wants ours
