"""One rollout's tensors for the simulator (``simulate.py``): what ``Engine.generate`` allocates on rank 0, without
transformers' ``generate`` loop, whose stopping test reads values (``.item()``) that fake tensors lack.

The loop's memory has two moments, both run here on the engine's own generating model (``Engine.generating``:
eval mode, no graph, the step's autocast; FSDP2 gathering each unit per forward, ZeRO-2 mode keeping them):
- the prefill: every prompt of the rank at once (``Generation.rows``), filling a KV cache of the prompt's length;
- the last decode step: the cache grown to prompt + completion - 1 positions (the loop's cache then, made here by
  extending the prefill's), one token per row. Only those two forwards run, so a 1024-token completion costs two
  forwards, not 1024.
Each forward's logits go through what the loop does with them (``sample``): the fp32 copy of the last position's
logits, bigtrain's ``SampledLogps`` (the log-probabilities it keeps), softmax and a multinomial draw. The workload
does not carry the run's sampling: TRL's defaults are taken (temperature 1, no top-k or top-p), which add no warper,
as the planner's term assumes (a top-p warper would add a sort of the vocabulary per row).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bigtrain.config.workload import Workload


def sample(logits: torch.Tensor, kept: Any, ids: torch.Tensor) -> torch.Tensor:
    """The next token of each row as transformers' sampling loop draws it from the model's last logits."""
    scores = kept(ids, logits[:, -1, :].to(copy=True, dtype=torch.float32))
    probs = torch.nn.functional.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1)


def _grown(cached: torch.Tensor, positions: int) -> torch.Tensor:
    """A layer's keys or values [rows, heads, length, head_dim] with ``positions`` more."""
    rows, heads, _, width = cached.shape
    return torch.cat([cached, cached.new_zeros(rows, heads, positions, width)], 2)


def generation_step(
    engine: Any,
    hf_config: Any,
    workload: Workload,
    dp: int,
    device: torch.device,
    each_call: Callable[[Any], Any] = lambda forward: forward,
) -> None:
    """Rank 0's prefill and last decode step of one rollout (the module docstring), on the engine's model, each
    forward called through ``each_call(model)`` (the simulator's tracker wants each in a module of its own)."""
    from transformers import DynamicCache

    from bigtrain.roles.rollout import SampledLogps

    g = workload.generation
    assert g is not None
    rows = g.rows(workload.global_batch_size, dp)
    kept = SampledLogps(1.0)  # TRL's temperature 1 (module docstring)
    with engine.generating() as model:
        ids = torch.randint(0, hf_config.vocab_size, (rows, g.prompt_len), device=device)
        cache = DynamicCache(config=hf_config)
        # the loop's attention mask (prompts are left-padded): it decides transformers' attention path
        mask = torch.ones_like(ids)
        out = each_call(model)(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=1)
        token = sample(out.logits, kept, ids)
        del out
        for layer in cache.layers:  # the cache as the loop's last step finds it: prompt + completion - 1 positions
            layer.keys, layer.values = (_grown(t, g.completion_len - 1) for t in (layer.keys, layer.values))
        mask = torch.ones(rows, g.prompt_len + g.completion_len, dtype=mask.dtype, device=device)
        out = each_call(model)(input_ids=token, attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=1)
        sample(out.logits, kept, token)
        del out, cache
