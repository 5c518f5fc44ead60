"""What a model transform is, what it receives, and the model it leaves for the engines.

A :class:`Transform` is one step that changes the model being built (``parallel/build.py`` runs them in the order
of ``transforms/__init__.py``). Besides changing the model it may contribute
- to the engine: the module forward is called on, the autocast dtype, the per-micro-step gradient-sync context
  (set on the :class:`BuiltModel` by ``apply``) and a hook run after every optimizer step that updated (``after_step``);
- to the values: ``on_allocated``, run once memory is allocated, and ``fill_values``, once the HF values are
  loaded (the initial adapters);
- to checkpoints and export: ``rename``, from a parameter's name as the transform leaves it to the name before it, so
  that every value and every checkpoint is keyed by the model's HF name whatever wrapped it;
- to the planner: ``planner_terms`` names the planner functions that model what it changes (memory or time), so that
  a reader (and a test) can go from the transform to its terms.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from bigtrain.config.hf import decoder_blocks
from bigtrain.config.plan import Plan
from bigtrain.config.schema import AdapterConfig
from bigtrain.parallel.mesh import WorldMesh


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """Everything the build reads: the one value every engine and the simulator hand to ``build_model``."""

    hf_config: Any
    plan: Plan
    device: torch.device
    mixed_precision: str = "fp32"
    attn_implementation: str = "sdpa"
    compile: bool = False  # train.compile
    fp8: str = "none"  # train.fp8: none, tensorwise or rowwise
    method: str = "full"  # train.method, resolved: full, lora or qlora
    lora: AdapterConfig = field(default_factory=AdapterConfig)  # the lora section (read by lora and qlora)
    pretrained: str | None = None  # a HF folder to read the values from (model.name_or_path); None: HF's init
    seed: int = 0  # of HF's initialisation when nothing is pretrained
    # "load": real values (pretrained or initialised); "empty": allocated, undefined (the simulator)
    values: Literal["load", "empty"] = "load"
    fake_mode: Any = None  # with values "empty": a FakeTensorMode to allocate under (shapes only, no memory)
    deepspeed_config: dict[str, Any] | None = None  # backend deepspeed: its complete JSON (zero.Init reads it)
    # semi-synchronous replica groups that are jobs of their own: how they reach each other (engine/replica_links);
    # None: over the mesh's dp_replicate dimension
    replicas: Any = None
    # a frozen model (a reference model's copy, roles/reference.py): no parameter trains
    frozen: bool = False
    freeze: tuple[str, ...] = ()  # model.freeze: the parts (or modules) of a vision-language model that do not train
    new_head: bool = False  # a classifier's pretrained head does not fit its data's classes: made afresh

    @property
    def partitioned_construction(self) -> bool:
        """DeepSpeed ZeRO-3 builds the model partitioned under ``deepspeed.zero.Init`` (it cannot take a meta model)."""
        return self.plan.backend == "deepspeed" and self.plan.zero_stage == 3


def no_sync_needed(last: bool) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


@dataclass
class BuiltModel:
    """The model of one rank as the transforms leave it: what every engine drives."""

    parts: list[nn.Module]  # the HF models this rank trains: the whole model, or its pipeline stages
    stage_ids: list[int]  # their pipeline stage indices ([0] without pipeline parallelism)
    plan: Plan
    mesh: WorldMesh
    compute_dtype: torch.dtype | None  # what the model computes in (None: the fp32 of the weights)
    module: nn.Module | None = None  # what forward is called on when it is not parts[0] (the DDP wrapper)
    # the dtype to autocast to, for backends that keep fp32 weights (FSDP2 casts parameters itself and clears it)
    autocast_dtype: torch.dtype | None = None
    # grad_sync(last) wraps one micro-step's forward and backward: whether gradients are reduced on this micro-step
    grad_sync: Callable[[bool], contextlib.AbstractContextManager] = no_sync_needed
    applied: list[Transform] = field(default_factory=list)  # the transforms that changed it, in order
    # how load_values turns a full value into a parameter's own kind of tensor (QLoRA's NF4), see materialize.Convert
    convert_value: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None
    # tensors a transform allocated besides parameters and buffers, alive for the whole run (the simulator's DDP
    # buckets): the simulator hands them to its memory tracker
    extra_tensors: list[torch.Tensor] = field(default_factory=list)
    # parallel.loss_chunk_tokens: the LM head the loss applies chunk by chunk (the model's forward then returns its
    # final hidden states as "logits"); None: the model's forward computes the logits
    loss_head: nn.Module | None = None
    # parallel.ep: the experts modules expert_parallel split over the ep ranks (FSDP2 shards them on their own mesh)
    experts: list[nn.Module] = field(default_factory=list)
    # train.fp8 under FSDP2 on CUDA (tensorwise): weights all-gathered in FP8, their scales precomputed after each step
    fp8_all_gather: bool = False
    # train.compile: the loss (losses/causal_lm.py) runs compiled too
    compile_loss: bool = False
    # modules whose parameters stay fp32 under a bf16/fp16 parameter cast (BatchNorm, ``batch_norm``): FSDP2 shards
    # each as a unit of its own with an fp32 parameter dtype, as FSDP1 kept BatchNorm out of its mixed precision
    full_precision: list[nn.Module] = field(default_factory=list)
    _block_slots: dict[int, list[tuple[nn.Module, str]]] = field(default_factory=dict, repr=False)

    @property
    def forward_module(self) -> nn.Module:
        return self.module if self.module is not None else self.parts[0]

    def replace_parts(self, parts: list[nn.Module], stage_ids: list[int]) -> None:
        """New parts (a pipeline's stages): the blocks found in the old ones are forgotten."""
        self.parts, self.stage_ids = parts, stage_ids
        self._block_slots.clear()

    def blocks(self, part: int) -> list[nn.Module]:
        """The decoder blocks of ``parts[part]`` as they stand now (a wrapper replaces a block in its slot)."""
        if part not in self._block_slots:
            self._block_slots[part] = [(parent, attr) for parent, attr, _ in decoder_blocks(self.parts[part])]
        return [getattr(parent, attr) for parent, attr in self._block_slots[part]]

    def replace_block(self, part: int, index: int, module: nn.Module) -> None:
        """Put ``module`` in the slot of block ``index`` of ``parts[part]`` (a wrapper around it)."""
        self.blocks(part)
        parent, attr = self._block_slots[part][index]
        setattr(parent, attr, module)  # ModuleList accepts setattr with its string index

    def hf_name(self, name: str) -> str:
        """The HF name of a parameter or buffer named ``name`` in one of the parts: each applied transform's rename,
        the last applied first."""
        for transform in reversed(self.applied):
            if transform.rename is not None:
                name = transform.rename(name)
        return name

    def after_optimizer_step(self) -> None:
        """What the transforms ask for after every optimizer step that updated the parameters (engines call it)."""
        for transform in self.applied:
            if transform.after_step is not None:
                transform.after_step(self)


@dataclass(frozen=True)
class BuildContext:
    options: BuildOptions
    mesh: WorldMesh


@dataclass(frozen=True)
class Transform:
    """One step of the build; ``apply`` changes ``built`` in place when ``wanted`` says the plan asks for it."""

    name: str
    wanted: Callable[[BuildOptions], bool]
    apply: Callable[[BuiltModel, BuildContext], None]
    rename: Callable[[str], str] | None = None  # name as this transform leaves it -> name before it
    after_step: Callable[[BuiltModel], None] | None = None  # after every optimizer step that updated
    # once the model's memory is allocated, before any value is written (``load_values``): what allocation cannot
    # make (QLoRA's NF4 tensors keep their shared code table and scale mean on meta)
    on_allocated: Callable[[BuiltModel, BuildContext], None] | None = None
    # after the model's values are loaded (``load_values``): values of parameters the transform added (adapters)
    fill_values: Callable[[BuiltModel, BuildContext], None] | None = None
    planner_terms: tuple[str, ...] = ()  # "module.function" under bigtrain.planner that model its effect
