"""What every run of the side-by-side benchmark shares (``side_by_side.py`` for bigtrain, ``peers.py`` for
torchtitan, torchtune and the HF Trainer): the models, their shapes, how steps are timed and what a record holds."""

from __future__ import annotations

import statistics
import time
from typing import Any

# Llama-3.2-1B's architecture untied (torchtitan's "1B" flavour has a separate output projection; compute is the
# same either way) and Llama-3-8B's width at 4 of its 32 layers (depth multiplies the block terms only).
LLAMA_1B = dict(
    model_type="llama",
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
LLAMA_8B_L4 = dict(LLAMA_1B, hidden_size=4096, intermediate_size=14336, num_hidden_layers=4)
MODELS: dict[str, dict[str, Any]] = {"llama-1b": LLAMA_1B, "llama-8b-L4": LLAMA_8B_L4}
# torchtitan's registry name for each (its 8B flavour is trimmed to the same depth in peers.py)
TITAN_FLAVOURS = {"llama-1b": "1B", "llama-8b-L4": "8B"}
SHAPES = {"llama-1b": (2048, 8), "llama-8b-L4": (2048, 4)}  # seq_len, sequences per step

STEPS, WARMUP = 12, 4  # the first WARMUP steps (compilation, allocator growth) are not timed


def timed_steps(step: Any, steps: int = STEPS) -> list[float]:
    """Run ``step()`` ``steps`` times, each between two CUDA synchronisations; the seconds of each."""
    import torch

    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def summary(model: str, times: list[float], **extra: Any) -> dict[str, Any]:
    """The record of one run: median of the timed steps, tokens/s, MFU, peak memory."""
    import torch

    from bigtrain.planner.cost import model_flops_per_token
    from bigtrain.planner.hardware import lookup_gpu
    from bigtrain.planner.model_stats import ModelStats

    seq, batch = SHAPES[model]
    step_s = statistics.median(times[WARMUP:])
    flops = model_flops_per_token(ModelStats.from_config(MODELS[model]), seq) * seq * batch
    gpu = lookup_gpu(torch.cuda.get_device_name())
    return {
        "model": model,
        "tokens_per_step": seq * batch,
        "step_s": step_s,
        "tokens_per_s": seq * batch / step_s,
        "mfu": flops / step_s / (gpu.peak_tflops * 1e12),
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "step_s_all": times,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        **extra,
    }
