"""What a text-to-image pipeline's frozen parts cost a plan, by where they run (``parallel.frozen_parts``,
``config/capabilities/frozen_parts.py``).

- ``cached``: nothing per step. The data cache's pass is made once per data and pipeline, before step 1, by one
  process, and every later run of the same data reads it.
- ``device``: every GPU holds the parts' weights in the compute dtype for the run (``other``), and each step encodes
  that rank's images and captions. The encode runs before the transformer's forwards and keeps nothing for
  backward; its own transient activations are not counted (not measured here).
- ``offloaded``: the weights live in host memory (each rank its copy). Each step moves every part to the GPU for its
  forward, one at a time, and back: the largest part is on the device while it encodes, before the forward holds any
  activations, so the peak is the larger of the training step's and the state with that part; each step also copies
  every part's weights over PCIe twice.
The encode's FLOPs: each text encoder's forward is 2 x its parameters per token it reads (T5: the caption's tokens,
CLIP: 77); the VAE's encoder is measured (``VAE_CONV_FLOPS``, ``VAE_ATTENTION_FLOPS``), at the rate the transformer's
matmuls achieve. A pipeline folder's parts are counted from its files (``config/diffusers_config.frozen_parts``); a
preset's are the published pipeline's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from bigtrain.config.capabilities.frozen_parts import FROZEN_PARTS, placement_of
from bigtrain.config.plan import Plan
from bigtrain.planner.cost import ACHIEVABLE, FP32_SLOWDOWN, TimeEstimate, longer_by
from bigtrain.planner.memory_terms import MARGIN_FIXED, MARGIN_FRACTION, MemoryEstimate

# FLUX's and SD3's VAE encoder (16 latent channels, blocks of 128-512 channels): FLOPs per pixel of its convolutions,
# and per pixel squared of its mid-block's attention over the latents (8 x 8 px each). Measured with torch's
# FlopCounterMode on diffusers' AutoencoderKL built from FLUX.1-dev's vae/config.json on meta: 0.273, 1.118 and 4.883
# TFLOP at 256, 512 and 1024 px a side (tests/unit/test_diffusion_planner.py measures it again)
VAE_CONV_FLOPS = 4.1321e6
VAE_ATTENTION_FLOPS = 0.5
# its parameters: another VAE's FLOPs are taken in proportion to its own (an approximation for VAEs not published)
VAE_PARAMS = 83_819_683
CLIP_TOKENS = 77  # the CLIP text encoders' length (diffusers' pipelines pad to it)
PLACEMENTS = ("cached", "device", "offloaded")
COSTS = {
    "cached": "their outputs computed once into the data cache: no memory and no compute per step",
    "device": "on every GPU for the run, encoding each step's images and captions",
    "offloaded": "in host memory, each moved to the GPU for its forward and back once a step",
}


@dataclass(frozen=True)
class FrozenPart:
    name: str
    params: int
    reads: str  # "t5" (the caption's tokens), "clip" (77 tokens) or "pixels" (the VAE)


@dataclass(frozen=True)
class FrozenParts:
    """A pipeline's frozen parts, and the tokens its T5 reads of a workload's text tokens (SD3's prompt embeddings
    hold its CLIPs' 77 before them)."""

    parts: tuple[FrozenPart, ...]
    clip_first: bool = False

    def described(self) -> str:
        return ", ".join(f"{p.name} {_count(p.params)}" for p in self.parts)

    def weight_bytes(self, workload: Any) -> int:
        return sum(p.params for p in self.parts) * workload.dtype_bytes

    def largest_bytes(self, workload: Any) -> int:
        return max(p.params for p in self.parts) * workload.dtype_bytes

    def flops_per_example(self, workload: Any) -> float:
        """One image's and caption's forward through every part."""
        t5 = workload.seq_len - (CLIP_TOKENS if self.clip_first else 0)
        pixels = workload.image_size**2
        total = 0.0
        for p in self.parts:
            if p.reads == "pixels":
                total += (VAE_CONV_FLOPS * pixels + VAE_ATTENTION_FLOPS * pixels**2) * p.params / VAE_PARAMS
            else:
                total += 2.0 * p.params * (t5 if p.reads == "t5" else CLIP_TOKENS)
        return total


def _count(params: int) -> str:
    if params >= 5e6:  # the published parts: CLIP-L 0.12B
        return f"{params / 1e9:.2f}B"
    return f"{params / 1e6:.2f}M" if params >= 1e6 else f"{params / 1e3:.1f}K"


def with_frozen_memory(estimate: MemoryEstimate, frozen: FrozenParts, plan: Plan, workload: Any) -> MemoryEstimate:
    """The step's peak with the frozen parts where ``plan`` places them (module docstring), its margin again."""
    placement, largest = placement_of(plan), frozen.largest_bytes(workload)
    if placement == "device":
        estimate = dataclasses.replace(estimate, other_bytes=estimate.other_bytes + frozen.weight_bytes(workload))
    elif placement == "offloaded" and largest > estimate.activations_bytes + estimate.other_bytes:
        estimate = dataclasses.replace(estimate, activations_bytes=0, other_bytes=largest)
    else:
        return estimate
    return dataclasses.replace(estimate, margin_bytes=MARGIN_FIXED + int(MARGIN_FRACTION * estimate.total_bytes))


def frozen_seconds(frozen: FrozenParts, plan: Plan, cluster: Any, workload: Any) -> float:
    """Seconds a step spends on the frozen parts on each rank: its images' encodes, and offloaded, the weights'
    copies over PCIe, to the device and back, once a step (``roles/frozen_parts.py``)."""
    placement = placement_of(plan)
    if placement == "cached":
        return 0.0
    rate = cluster.gpu.peak_tflops * 1e12 * ACHIEVABLE / (FP32_SLOWDOWN if workload.mixed_precision == "fp32" else 1)
    rows = workload.global_batch_size / plan.dp
    seconds = rows * frozen.flops_per_example(workload) / rate
    if placement == "offloaded":  # every part to the device and back, once a step
        seconds += 2 * frozen.weight_bytes(workload) / (cluster.gpu.pcie_gbps * 1e9)
    return seconds


def with_frozen_time(estimate: TimeEstimate, frozen: FrozenParts, plan: Plan, cluster: Any, workload: Any) -> Any:
    """A step's time with the frozen parts' seconds, as compute."""
    return longer_by(estimate, frozen_seconds(frozen, plan, cluster, workload), compute=True)


def frozen_host_bytes(frozen: FrozenParts, plan: Plan, workload: Any) -> int:
    """Host memory per GPU: each rank's copy of the offloaded parts."""
    return frozen.weight_bytes(workload) if placement_of(plan) == "offloaded" else 0


def placement_note(frozen: FrozenParts, candidate: Any, cluster: Any, estimate: Any) -> list[str]:
    """The chosen plan's placement of the frozen parts, and the same plan's peak and step time with each other
    placement (``estimate(plan) -> (memory, time)``), fitting or not."""
    chosen = placement_of(candidate.plan)
    have = cluster.gpu.memory_bytes
    lines = [f"frozen parts: {chosen}: {COSTS[chosen]}"]
    for other in PLACEMENTS:
        if other == chosen:
            continue
        memory, time = estimate(candidate.plan.with_option(FROZEN_PARTS.name, other))
        need = memory.budget_bytes
        verdict = "fits" if need <= have else "does not fit"
        lines.append(
            f"  {other} instead: {need / 2**30:.1f} GiB (peak + margin) of {have / 2**30:.1f} GiB, "
            f"{time.step_s:.3f} s/step ({time.step_s / candidate.time.step_s - 1:+.1%}): {verdict}"
        )
    return lines
