"""Predicted peak tensor memory of one device for a DeepSpeed ZeRO plan: what DeepSpeed 0.19 allocates, as measured
on its real step (``bench/deepspeed_memory.py``: every tensor storage from before ``deepspeed.initialize`` on,
fp32 on CPU gloo ranks, the busiest rank of 2 and 4; ``bench/results/deepspeed_memory.md``).

Symbols as in ``memory_terms.py``: Ψ parameters, dp data-parallel ranks, a bytes of the compute dtype, h hidden size,
V·h the LM head (the largest parameter of every model we plan for, with the embedding).

At rest:
- ZeRO-1/2 keep the whole model in one flat compute-dtype buffer (aΨ); ZeRO-3 keeps a partition of it (aΨ/dp)
  and a persistent gradient-partition buffer of the same size.
- All stages keep the fp32 master copy and AdamW's m and v as partitions (12Ψ/dp) unless ``offload_optimizer``
  moves them to the host; ``offload_params`` moves ZeRO-3's parameter partition there.
During the step, the largest of these moments:
- the loss backward's start: activations and logits (``memory_terms.py``), one reduction bucket (a·h², the
  templates' reduce_bucket_size), and for ZeRO-1/2 the gradient partition of earlier micro-steps. That partition is
  allocated for the whole parameters touching this rank's slice, so the busiest rank holds a·(Ψ/dp + V·h)
  (a large parameter straddling its boundary is copied whole);
- just after the logits' backward, on the rank whose slice ends with the LM head: the head's fresh gradient
  (a·V·h), that gradient partition (its first gradient allocated it), the blocks' activations (logits freed);
- ZeRO-1 at the end of backward: every gradient (aΨ, reduced only at the accumulation boundary) and the
  gradient partition being filled;
- ZeRO-3: every gathered parameter stays alive from forward to backward up to stage3_max_live_parameters (the
  DeepSpeed default 1e9 elements the templates keep), i.e. the whole model below that size;
- the optimizer step: the gradient partition, its flat fp32 copy and AdamW's foreach temporary (4Ψ/dp each; ZeRO-3
  three fp32 partition-sized temporaries). Offloaded, the step runs on the host.
"""

from __future__ import annotations

from bigtrain.config.plan import Plan
from bigtrain.config.workload import Workload
from bigtrain.planner.memory_terms import (
    MemoryEstimate,
    activation_bytes,
    device_margin,
    frozen_params,
    logits_bytes,
)
from bigtrain.planner.model_stats import ModelStats

# DeepSpeed's default stage3_max_live_parameters (the templates leave it unset)
DEEPSPEED_MAX_LIVE_PARAMETERS = 10**9


def estimate_deepspeed_memory(stats: ModelStats, plan: Plan, workload: Workload) -> MemoryEstimate:
    """The predicted peak of the busiest rank and its parts at that moment."""
    seq_len, a = workload.seq_len, workload.dtype_bytes
    psi, dp = stats.params, plan.dp
    trained = psi - frozen_params(stats, workload)  # model.freeze: no gradient, no optimizer state
    accum = plan.grad_accum_steps(workload.global_batch_size)
    head = stats.head_params
    logits = logits_bytes(stats, plan, seq_len, a)
    activations = activation_bytes(stats, plan, seq_len, a) + logits
    offloaded = plan.offload_optimizer
    optim = 0 if offloaded else 12 * trained // dp
    bucket = a * stats.hidden * stats.hidden
    # each moment: (gradients, activations, other)
    if plan.zero_stage >= 3:
        params = 0 if plan.offload_params else a * psi // dp
        partition = 0 if offloaded else a * trained // dp
        gathered = a * min(psi, DEEPSPEED_MAX_LIVE_PARAMETERS)
        temps = 0 if offloaded else 3 * 4 * trained // dp
        moments = [(partition, activations, gathered), (partition, 0, temps)]
    else:
        params = a * psi
        partition = 0 if offloaded else a * min(trained, trained // dp + head)
        temps = 0 if offloaded else 2 * 4 * trained // dp
        moments = [
            (partition if accum > 1 else 0, activations, bucket),
            (partition + a * head, activations - logits, 0),
            (partition, 0, temps),
        ]
        if plan.zero_stage == 1:
            moments.append((a * trained + partition, 0, 0))
    peak = max(moments, key=sum)
    margin = device_margin(stats, plan, seq_len, params + optim + sum(peak))
    return MemoryEstimate(params, peak[0], optim, peak[1], peak[2], margin)
