"""The frozen parts of a text-to-image pipeline run during training (``parallel.frozen_parts``: device or offloaded,
``config/capabilities/frozen_parts.py``): the VAE encodes each micro-batch's images and the text encoders its
captions, under no_grad, before the transformer's forward, into the micro-batch the data cache would have given
(``data/denoise_batch.py``).

- ``device``: the parts are loaded on the device for the run;
- ``offloaded``: they stay in host memory, and diffusers' model offload (accelerate's hooks) moves each to the device
  for its own forward, the one before it back to the host; the last is sent back once the step's micro-batches are
  encoded, so that none stays on the device through the transformer's forwards and backwards.
A step's captions go through the text encoders together, then each micro-batch's images through the VAE: each part
moves once a step. On a GPU in bf16 an encode's last bits depend on the batch it runs in, as the cache's chunks of 8
do; in fp32 on the host every placement gives the same micro-batch (``tests/unit/test_frozen_parts.py``).
They run in the dtype the data cache encodes with (``encoded_images.frozen_dtype``: on a GPU train.mixed_precision's,
as diffusers' scripts cast them), the prompt through the pipeline's own ``encode_prompt``, as the cache's encoding
does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bigtrain.config.capabilities.frozen_parts import LIVE, placement_of
from bigtrain.config.diffusers_config import quiet_pipeline
from bigtrain.data.denoise_batch import ImageBatch
from bigtrain.data.encoded_images import frozen_dtype, frozen_pipeline, prompt_embeddings
from bigtrain.engine.base import Reference


class FrozenParts(Reference):
    """The pipeline's VAE and text encoders, placed as ``placement`` says, encoding each ``ImageBatch``."""

    def __init__(self, pipeline: Path, placement: str, device: torch.device, mixed_precision: str) -> None:
        assert placement in LIVE, placement
        self.device, self.offloaded = device, placement == "offloaded"
        self.dtype = frozen_dtype(device, mixed_precision)
        self.pipe = frozen_pipeline(pipeline, self.dtype)
        for part in self.pipe.components.values():
            if isinstance(part, torch.nn.Module):
                part.eval().requires_grad_(False)
        if self.offloaded:
            self.pipe.enable_model_cpu_offload(device=device)
        else:
            self.pipe.to(device)

    def attach(self, batch: Any) -> Any:
        return self.attach_step([batch])[0]

    def attach_step(self, micro_batches: list[Any]) -> list[Any]:
        """The transformer's micro-batches of a step's images and captions (micro-batches already encoded pass
        through): every caption of the step through the text encoders at once, then each micro-batch's images
        through the VAE, so that offloaded parts move to the device and back once a step."""
        raw = [i for i, batch in enumerate(micro_batches) if isinstance(batch, ImageBatch)]
        if not raw:
            return micro_batches
        out = list(micro_batches)
        captions = [c for i in raw for c in micro_batches[i].captions]
        with torch.no_grad(), quiet_pipeline():
            embeds, pooled = prompt_embeddings(self.pipe, captions, self.device, micro_batches[raw[0]].text_len)
            start = 0
            for i in raw:
                batch = micro_batches[i]
                dist = self.pipe.vae.encode(batch.pixels.to(self.device, self.dtype)).latent_dist
                text = slice(start, start + len(batch.captions))
                start = text.stop
                moments = (dist.mean.float(), dist.logvar.float())
                out[i] = batch.noiser.batch(moments, batch.drawn, (embeds[text].float(), pooled[text].float()),
                                            batch.labels)  # fmt: skip
            if self.offloaded:  # the VAE back to the host too: the transformer's step has the device to itself
                self.pipe.maybe_free_model_hooks()
        return out


def attach_frozen_parts(engine: Any, options: Any, train: Any) -> None:
    """The frozen parts onto the engine, where the plan runs them during training (a pipeline folder's: a simulated
    step of a preset has none, and its micro-batches are encoded already)."""
    pipeline = Path(str(options.pretrained)) if options.pretrained else None
    if placement_of(options.plan) in LIVE and pipeline is not None and (pipeline / "model_index.json").is_file():
        engine.reference = FrozenParts(pipeline, placement_of(options.plan), options.device, options.mixed_precision)
