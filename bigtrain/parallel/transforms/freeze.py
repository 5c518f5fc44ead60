"""``model.freeze``: the named parts of a vision-language model (its vision tower, projector or language model, or
modules by their own names, ``models/vision_language.py``) do not train.

Their parameters stop requiring gradients on the meta model, before anything wraps or shards it: no gradient is
computed or reduced for them, the optimizer never holds them (so weight decay never touches them) and their values
stay bit-identical. After the adapters: under LoRA the base is frozen already, and freezing only decides which of
``lora.modules_to_save`` stay fixed. Unlike an adapter run's frozen base, these parameters are model state: the
checkpoints keep them, so a run resumes and exports without reading its starting folder again.
"""

from __future__ import annotations

from bigtrain.config.model_parts import frozen_parameters
from bigtrain.parallel.transforms.base import BuildContext, BuildOptions, BuiltModel, Transform


def wanted(options: BuildOptions) -> bool:
    return bool(options.freeze)


def apply(built: BuiltModel, ctx: BuildContext) -> None:
    for part in built.parts:
        names = set(frozen_parameters(part, list(ctx.options.freeze)))
        for name, param in part.named_parameters():
            if name in names:
                param.requires_grad_(False)


TRANSFORM = Transform(name="freeze", wanted=wanted, apply=apply, planner_terms=("memory_terms.frozen_params",))
