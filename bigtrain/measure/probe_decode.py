"""What one step of transformers' ``generate`` costs the host, whatever the model's size: the seconds per generated
token of tiny Llamas (width 64, batch 1, where the arithmetic is nothing), for 1 and 3 blocks, split into a fixed
part (the loop: sampling, stopping, the cache's and the mask's bookkeeping) and a part per block (its modules'
Python and launches). The planner's rollout time (``planner/rollout_time.py``) adds them to each decode step."""

from __future__ import annotations

import time
from typing import Any

import torch

TOKENS = 32  # generated per timing
REPEATS = 3


def _seconds_per_token(device: torch.device, layers: int) -> float:
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    model = LlamaForCausalLM(config).to(device).eval()
    ids = torch.ones(1, 8, dtype=torch.long, device=device)
    generation = GenerationConfig(
        do_sample=True, max_new_tokens=TOKENS, min_new_tokens=TOKENS, pad_token_id=0, eos_token_id=1
    )
    best = float("inf")
    with torch.no_grad():
        for _ in range(REPEATS + 1):  # the first warms up
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=generation)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - start)
    return best / TOKENS


def decode_overhead(device: torch.device) -> dict[str, Any]:
    """{"fixed": seconds per decode step, "per_block": seconds per block and decode step}."""
    one, three = _seconds_per_token(device, 1), _seconds_per_token(device, 3)
    per_block = max((three - one) / 2, 0.0)
    return {"fixed": max(one - per_block, 0.0), "per_block": per_block}
