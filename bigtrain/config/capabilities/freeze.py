"""``model.freeze``: named parts of a model (a vision-language model's vision tower, projector or language model,
or modules by their own names: ``config/model_parts.py``) do not train (``parallel/transforms/freeze.py``).

Their parameters stop requiring gradients on the meta model, right after the adapters and before anything slices,
wraps or shards them: no gradient, reduction or optimizer state is made for them. The planner counts them as frozen
(``memory_terms.frozen_params``); start-up checks the names against the model (``config/model_parts.py``).
"""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, ModelStep

CAPABILITY = Capability(
    name="freeze",
    summary="parts of a model frozen by name (`model.freeze`: a vision-language model's tower, projector, ...)",
    keys=("model.freeze",),
    steps=(
        ModelStep(
            "freeze",
            after="adapters",
            code="bigtrain.parallel.transforms.freeze",
            planner_terms=("memory_terms.frozen_params",),
        ),
    ),
)
