"""Pipeline stages cut by hand from a HF causal LM on ``meta`` (torch's tracing front end fails on HF rotary
models), each one a complete HF model that holds only its own part.

A stage is a deep copy of the meta model in which every decoder layer another stage owns is replaced *in place* by a
parameter-free pass-through, so the layers it keeps have their original indices (``model.layers.7.mlp...``): the
parameter names, checkpoints and HF exports are those of the unsplit model, and a checkpoint moves freely between
pp and FSDP-only plans. The first stage keeps the embeddings (later stages are fed ``inputs_embeds``), the last the
final norm and the LM head (earlier stages pass the last hidden state through); every stage computes its own rotary
embeddings and causal mask from the sequence, as HF's model does. Which modules these are comes from the model's
own ``base_model_pp_plan`` (embed_tokens, layers, norm), which the capability table requires.

``torch.distributed.pipelining`` calls a stage with one tensor and wants one tensor back; two forward hooks turn the
HF call convention into that (the hooks, not a wrapper module, so that the stage model itself stays the FSDP root
that the pipeline's gradient reduction drives, and its parameter names stay the HF names).
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from bigtrain.config.pipeline import num_stages, stage_layer_ranges, stages_of_rank
from bigtrain.config.plan import Plan
from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform


class SkippedLayer(nn.Module):
    """Stands where another stage's decoder layer was: returns the hidden states unchanged, holds no parameters."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        if hasattr(layer, "attention_type"):  # some HF models read it while looping over their layers
            self.attention_type = layer.attention_type

    def forward(self, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        return hidden_states


def _stage_inputs_hook(first: bool):  # noqa: ANN202
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:  # the pipeline passes the micro-batch (token ids) or the previous stage's output positionally
            kwargs = {**kwargs, ("input_ids" if first else "inputs_embeds"): args[0]}
        return (), kwargs

    return hook


def _stage_output_hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
    out = output.logits  # the logits on the last stage; the last hidden state elsewhere (see build_stage)
    # HF slices the hidden states before its (here identity) head: a view, on which FSDP2's backward hook would not
    # survive an in-place op downstream; one copy of the stage's output makes it a tensor of its own
    return out.clone() if out._is_view() else out


def build_stage(meta_model: nn.Module, stage: int, stages: int, layers: range) -> nn.Module:
    """A copy of ``meta_model`` (on meta) that computes stage ``stage`` of ``stages``, owning decoder ``layers``."""
    model = copy.deepcopy(meta_model)
    base = model.base_model
    for i, layer in enumerate(base.layers):
        if i not in layers:
            base.layers[i] = SkippedLayer(layer)
    first, last = stage == 0, stage == stages - 1
    if not first:
        base.embed_tokens = None  # HF's model reads it only when given input_ids
    if not last:
        base.norm = nn.Identity()
        model.lm_head = nn.Identity()  # the "logits" of an inner stage are its last hidden state
    model.register_forward_pre_hook(_stage_inputs_hook(first), with_kwargs=True, prepend=True)
    model.register_forward_hook(_stage_output_hook, with_kwargs=True, prepend=True)
    return model


def build_stages(meta_model: nn.Module, hf_config: Any, plan: Plan, stage_ids: list[int]) -> list[nn.Module]:
    """The stage models of one pp rank (``stage_ids``: config.pipeline.stages_of_rank)."""
    stages = num_stages(plan)
    ranges = stage_layer_ranges(hf_config.num_hidden_layers, stages)
    return [build_stage(meta_model, s, stages, ranges[s]) for s in stage_ids]


def _split(built: BuiltModel, ctx: BuildContext) -> None:
    """The whole meta model becomes this rank's stages (copies: the model they were cut from is dropped)."""
    stage_ids = stages_of_rank(ctx.mesh.coordinate("pp"), built.plan)
    built.replace_parts(build_stages(built.parts[0], ctx.options.hf_config, built.plan, stage_ids), stage_ids)


TRANSFORM = Transform(
    name="pipeline_split",
    wanted=lambda options: options.plan.pp > 1,
    apply=_split,
    planner_terms=("pipeline_memory.estimate_pipeline_memory", "cost.estimate_time"),
)
