"""The one model-build path: every engine and the simulator get their model from ``build_model``.

1. The job's mesh (``mesh.py``): every degree and coordinate the transforms read.
2. The HF model, constructed on ``meta`` (structure and shapes, no memory), or for DeepSpeed ZeRO-3 partitioned as
   it is built under ``deepspeed.zero.Init`` (DeepSpeed cannot take a meta model).
3. The model transforms the plan asks for, in the one order of ``transforms/__init__.py``: pipeline split, tensor
   parallel, activation checkpointing, compile, FSDP2, the values, DDP.
The result, a :class:`BuiltModel`, is what ``engine/__init__.build_engine`` hands to the engine of the plan.
"""

from __future__ import annotations

from collections.abc import Sequence

from bigtrain.models.build import build_meta_model, build_partitioned_model
from bigtrain.parallel.mesh import WorldMesh, build_world_mesh
from bigtrain.parallel.precision import COMPUTE_DTYPES
from bigtrain.parallel.transforms import ORDER
from bigtrain.parallel.transforms.base import BuildContext, BuildOptions, BuiltModel, Transform


def build_model(
    options: BuildOptions, transforms: Sequence[Transform] = ORDER, mesh: WorldMesh | None = None
) -> BuiltModel:
    """This rank's model for ``options.plan``; the process group must exist (``transforms``: tests add their own;
    ``mesh``: a second model of the same job, a preference objective's reference, on the first one's groups)."""
    mesh = mesh or build_world_mesh(options.plan, options.device.type)
    if options.partitioned_construction:
        assert options.deepspeed_config is not None, "ZeRO-3 construction reads the DeepSpeed config"
        model = build_partitioned_model(options.hf_config, options.attn_implementation, options.deepspeed_config)
    else:
        model = build_meta_model(options.hf_config, options.attn_implementation)
    compute_dtype = COMPUTE_DTYPES[options.mixed_precision]
    if options.frozen:  # never updated: no fp32 master copy
        model.requires_grad_(False)
        # its parameters in the compute dtype (buffers as they are), as FSDP2 and DeepSpeed compute the policy; under
        # DDP the policy keeps fp32 weights and autocasts only the matmuls, which a bf16 copy would not reproduce
        if options.plan.backend != "ddp":
            for param in model.parameters():
                param.data = param.data.to(compute_dtype or param.dtype)
    # a plain model keeps fp32 weights and computes under autocast, unless a transform casts parameters itself
    built = BuiltModel(
        parts=[model],
        stage_ids=[0],
        plan=options.plan,
        mesh=mesh,
        compute_dtype=compute_dtype,
        autocast_dtype=compute_dtype,
    )
    ctx = BuildContext(options, mesh)
    for transform in transforms:
        if transform.wanted(options):
            transform.apply(built, ctx)
            built.applied.append(transform)
    return built
