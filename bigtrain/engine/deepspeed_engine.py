"""The DeepSpeed engine: ZeRO-1/2/3 (with ZeRO-Offload) through ``deepspeed.initialize``, behind bigtrain's engine
interface, so that the loop, the metrics and the loss normalisation are those of every other plan.

- Config: the plan's template from ``deepspeed_configs/`` (or ``parallel.deepspeed_config``), filled and checked
  against the recipe by ``config/deepspeed.py``.
- Model: from the one build path (``parallel/build.py``). ZeRO-1/2 hold the whole model on every rank, so it is
  materialised as for DDP (same values as every other plan). ZeRO-3 builds it under ``deepspeed.zero.Init``, which
  partitions each parameter as its module is constructed (a meta model cannot be handed to DeepSpeed), then writes
  the values one parameter at a time through ``GatheredParameters``: no rank ever holds more than one full
  parameter, and pretrained weights are read one module at a time from their safetensors.
- Optimizer and schedule: the recipe's AdamW and warmup/cosine, passed as objects (DeepSpeed wraps the AdamW in its
  ZeRO optimizer, which steps it on the fp32 partitions; offloaded, on the host).
- Step: DeepSpeed owns backward, accumulation, clipping and fp16 loss scaling. Its ``backward`` would divide the
  loss by the accumulation steps and its reduction averages over the data-parallel ranks; bigtrain's loss is already
  the token sum over 1 / (predicted tokens of the global batch), so backward runs without the first
  (``scale_wrt_gas=False``) and the loss is multiplied by the ranks to undo the second. ``engine.step()`` follows
  every micro-batch (DeepSpeed counts micro-steps to find the boundary; it updates only there).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bigtrain.data.batch import MicroBatch
from bigtrain.engine.base import Engine, StepResult, replaying, step_sums
from bigtrain.engine.torch_native import OptimizerFactory, SchedulerFactory
from bigtrain.models.build import init_deepspeed_comm
from bigtrain.parallel.transforms.base import BuiltModel
from bigtrain.parallel.transforms.batch_norm import keep_statistics_fp32


class DeepSpeedZeroEngine(Engine):
    def __init__(self, ds_engine: Any, built: BuiltModel, scheduler: Any, device: torch.device, config: dict) -> None:
        self.ds = ds_engine
        self.built = built
        self.plan = built.plan
        self.scheduler = scheduler
        self.device = device
        self.config = config
        self.fp16 = bool(config.get("fp16", {}).get("enabled"))

    @classmethod
    def create(
        cls,
        built: BuiltModel,
        config: dict[str, Any],
        make_optimizer: OptimizerFactory,
        make_scheduler: SchedulerFactory,
        device: torch.device,
    ) -> DeepSpeedZeroEngine:
        """``deepspeed.initialize`` over the built model with the recipe's AdamW and schedule and the plan's JSON."""
        import deepspeed

        init_deepspeed_comm()
        model = built.parts[0]
        optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad])
        scheduler = make_scheduler(optimizer)
        ds_engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config, dist_init_required=False
        )
        keep_statistics_fp32(model)  # DeepSpeed cast every buffer with the model under bf16/fp16
        return cls(ds_engine, built, scheduler, device, config)

    @property
    def dp_rank(self) -> int:
        return dist.get_rank()  # ZeRO shards over the whole world: every rank reads its own samples

    @property
    def dp_size(self) -> int:
        return dist.get_world_size()

    def data_parallel_sum(self, value: int) -> int:
        total = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(total)
        return int(total.item())

    def _inputs(self, batch: MicroBatch) -> dict[str, torch.Tensor]:
        """The model's inputs, floating ones (an image's pixels) in the dtype DeepSpeed cast the model to (bf16/fp16:
        it runs no autocast); token ids as they are."""
        dtype = self.built.compute_dtype
        inputs = batch.model_inputs()
        if dtype is None:
            return inputs
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}

    def model_output(self, batch: MicroBatch) -> Any:
        with replaying(batch):
            return self.ds(**self._inputs(batch))

    @property
    def batch_group(self) -> Any:
        return dist.group.WORLD  # DeepSpeed's plans here are data-parallel over every rank

    def generate(self, **kwargs: Any) -> torch.Tensor:
        # the engine's module: ZeRO-3's hooks gather each submodule's parameters for every forward of the loop (every
        # rank generating together, synced_gpus), ZeRO-1/2's whole copy in the dtype DeepSpeed cast it to
        self.ds.eval()
        try:
            with torch.no_grad():
                return self.ds.module.generate(**kwargs)
        finally:
            self.ds.train()

    def forward_backward(self, micro_batches: list[MicroBatch], loss_factor: float) -> torch.Tensor:
        factor = loss_factor * self.dp_size  # DeepSpeed averages over the ranks: back to the sum (module docstring)
        # the router loss: its mean over every forward of the global batch (losses/causal_lm.router_loss;
        # DeepSpeed's average over the ranks is the rest of that mean)
        router_factor = self.objective.per_forward_weight / len(micro_batches)
        micro_batches = self.with_reference(micro_batches)
        sums = torch.zeros(1 + len(self.objective.metric_names), device=self.device)
        for i, batch in enumerate(micro_batches):
            output = self.model_output(batch)  # a role's recorded random state replayed (in-batch negatives' dropout)
            terms = self.objective(output, batch)
            loss, router = terms.loss_sum, terms.per_forward
            del output
            objective = loss * factor
            if router is not None and router_factor:
                objective = objective + router * router_factor
            self.ds.backward(objective, scale_wrt_gas=False)
            sums += step_sums(loss.detach(), terms)
            if i < len(micro_batches) - 1:
                self.ds.step()  # not a boundary: DeepSpeed only counts the micro-step
        dist.all_reduce(sums)
        return sums

    def eval_sums(self, micro_batches: list[MicroBatch]) -> torch.Tensor:
        parts = []
        self.ds.eval()
        try:
            micro_batches = self.with_reference(micro_batches)  # a role's own pass in eval mode too
            with torch.no_grad():
                for batch in micro_batches:
                    output = self.ds(**self._inputs(batch))
                    terms = self.objective(output, batch)
                    loss = terms.loss_sum.float().reshape(1)
                    parts.append(torch.cat([loss, self.objective.eval_sums(output, batch, terms)]))
        finally:
            self.ds.train()
        total = torch.stack(parts).sum(0)
        dist.all_reduce(total)
        return total

    def step(self, max_norm: float) -> StepResult:
        if not self.ds.is_gradient_accumulation_boundary():
            raise RuntimeError(
                "DeepSpeed's accumulation count disagrees with the step's micro-batches "
                f"(gradient_accumulation_steps={self.ds.gradient_accumulation_steps()})"
            )
        lr = self.scheduler.get_last_lr()[0]
        optimizer = self.ds.optimizer
        scale = self._loss_scale()
        self.ds.step()  # clip (gradient_clipping = train.grad_clip), AdamW, schedule
        skipped = bool(getattr(optimizer, "overflow", False)) if self.fp16 else False
        if not skipped:
            self.built.after_optimizer_step()
        norm = self.ds.get_global_grad_norm()
        grad_norm = torch.as_tensor(float("nan") if norm is None else norm, dtype=torch.float32).reshape(())
        return StepResult(grad_norm=grad_norm, lr=lr, skipped=skipped, loss_scale=scale)

    def close(self) -> None:
        """Give the process torch's own ``F.linear`` back. ``deepspeed.zero.Init`` replaces it with ZeRO-3's wrapper
        for the whole process ("This will persist unless manually reset"), so whatever runs next in the process (a
        reference loop, an HF Trainer, another job of a shared launch) would compute its linears through that
        wrapper: a ZeRO-2 job after a ZeRO-3 one trained Idefics3's vision attention to other values with selective
        checkpointing, and a QLoRA reference's NF4 linears failed in it."""
        from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as patcher

        original = getattr(patcher, "linear_bk", None)
        if original is not None:
            torch.nn.functional.linear = original

    def zero_grad(self) -> None:
        pass  # DeepSpeed clears its gradient partitions itself after each boundary step

    def _named_params(self) -> list[tuple[str, nn.Parameter]]:
        """Every trained parameter under each of its HF names (a tied weight under both), in a fixed order; frozen
        ones (the base under LoRA) are not state: they come from the base model."""
        named = self.ds.module.named_parameters(remove_duplicate=False)
        return [(self.built.hf_name(n), p) for n, p in named if p.requires_grad]

    def _frozen_params(self) -> list[tuple[str, nn.Parameter]]:
        """The parameters ``model.freeze`` keeps fixed, by HF name (an adapter run's frozen base is not state)."""
        if any(t.name == "adapters" for t in self.built.applied):
            return []
        named = self.ds.module.named_parameters(remove_duplicate=False)
        return [(self.built.hf_name(n), p) for n, p in named if not p.requires_grad]

    @staticmethod
    def _full_value(param: nn.Parameter) -> torch.Tensor:
        """A parameter's whole value on the host (gathered from its ZeRO-3 partitions: collective, every rank)."""
        import deepspeed

        with deepspeed.zero.GatheredParameters([param], enabled=hasattr(param, "ds_id")):
            return param.detach().float().cpu().clone()

    def _persistent_buffers(self) -> list[tuple[str, torch.Tensor]]:
        """The buffers a state dict holds (not the non-persistent ones, such as rotary frequencies), by HF name:
        what torch's state dict of the torch-native engines holds besides the parameters."""
        out = []
        for module_name, module in self.ds.module.named_modules():
            for name, buffer in module.named_buffers(recurse=False):
                if buffer is not None and name not in module._non_persistent_buffers_set:
                    out.append((self.built.hf_name(f"{module_name}.{name}" if module_name else name), buffer))
        return out

    def state_dict(self) -> dict[str, Any]:
        """The state as the torch-native engines key it (``state.<name>.exp_avg``, ``param_groups.<name>.lr``, ...),
        so a DeepSpeed checkpoint resumes on FSDP2 or DDP and on any world size, and the other way round.

        Each value is the *full* fp32 tensor, assembled from the ZeRO partitions (``deepspeed.utils``; collective
        under ZeRO-3, where every rank walks the parameters in the same order): saving costs host memory for the
        full fp32 parameters and both Adam moments on every rank at once (16 bytes per parameter); DCP writes one
        copy of each.
        """
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        self._ensure_optimizer_state()
        group = self._client_group()
        step = self._client_step()
        model: dict[str, Any] = {}
        optim: dict[str, Any] = {}
        full: dict[int, tuple[torch.Tensor, ...]] = {}  # a tied weight is assembled once, stored under each name
        for name, param in self._named_params():
            if id(param) not in full:
                full[id(param)] = tuple(
                    value.detach().cpu()
                    for value in (
                        safe_get_full_fp32_param(param),
                        safe_get_full_optimizer_state(param, "exp_avg"),
                        safe_get_full_optimizer_state(param, "exp_avg_sq"),
                    )
                )
            model[name], optim[f"state.{name}.exp_avg"], optim[f"state.{name}.exp_avg_sq"] = full[id(param)]
            optim[f"state.{name}.step"] = step.clone()
            for key, value in group.items():
                if key != "params":
                    optim[f"param_groups.{name}.{key}"] = value
        for name, buffer in self._persistent_buffers():  # BatchNorm's running statistics (the same on every rank)
            model[name] = buffer.detach().cpu().clone()
        for name, param in self._frozen_params():  # model.freeze's parts: model state, never updated
            model[name] = self._full_value(param)
        scale = self._loss_scale()
        scaler = {} if scale is None else {"scale": scale, "clean_steps": 0}
        return {"model": model, "optimizer": optim, "scheduler": self.scheduler.state_dict(), "loss_scaler": scaler}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Write the full values back: the compute weights (gathered under ZeRO-3) and DeepSpeed's fp32 partitions
        and Adam moments; the step count and the schedule."""
        import deepspeed
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        self._ensure_optimizer_state()
        model, optim = state["model"], state["optimizer"]
        done: set[int] = set()
        for name, param in self._named_params():
            if id(param) in done:
                continue  # a tied weight: written once
            done.add(id(param))
            value = model[name]
            if hasattr(param, "ds_id"):
                with deepspeed.zero.GatheredParameters([param], modifier_rank=0), torch.no_grad():
                    param.copy_(value.to(device=param.device, dtype=param.dtype))
            else:
                with torch.no_grad():
                    param.copy_(value.to(device=param.device, dtype=param.dtype))
            safe_set_full_fp32_param(param, value.to(self.device, torch.float32))
            for key in ("exp_avg", "exp_avg_sq"):
                safe_set_full_optimizer_state(param, optim[f"state.{name}.{key}"].to(self.device), key)
        with torch.no_grad():
            for name, buffer in self._persistent_buffers():
                buffer.copy_(model[name].to(device=buffer.device, dtype=buffer.dtype))
        for name, param in self._frozen_params():
            value = model[name]
            with deepspeed.zero.GatheredParameters([param], modifier_rank=0, enabled=hasattr(param, "ds_id")):
                with torch.no_grad():
                    param.copy_(value.to(device=param.device, dtype=param.dtype))
        # the group's hyperparameters as saved: above all its current lr, which the schedule's own state does not
        # carry (LambdaLR writes it into the group at each step)
        first = self._named_params()[0][0]
        prefix = f"param_groups.{first}."
        for key, value in optim.items():
            if key.startswith(prefix) and key[len(prefix) :] in self._client_group():
                for group in self._client_optimizer().param_groups:
                    group[key[len(prefix) :]] = value
        step = next((v for k, v in optim.items() if k.startswith("state.") and k.endswith(".step")), None)
        if step is not None:
            for flat_state in self._client_optimizer().state.values():
                flat_state["step"] = torch.as_tensor(step, dtype=torch.float32).clone()
        self.scheduler.load_state_dict(state["scheduler"])
        scaler = getattr(self.ds.optimizer, "loss_scaler", None)
        if self.fp16 and scaler is not None and state.get("loss_scaler"):
            scaler.cur_scale = float(state["loss_scaler"]["scale"])

    def _ensure_optimizer_state(self) -> None:
        """AdamW creates its state at its first step, and DeepSpeed links each parameter to its slice of that state
        only then; a checkpoint loaded before any step needs both now. The state is what AdamW itself would create
        (step 0, zero moments), so the first step that follows is unchanged."""
        optimizer = self._client_optimizer()
        # ZeRO-3 keys the state by its fp32 sub-group partitions (what its get/set of full states reads)
        groups = optimizer.param_groups
        flats = [(flat, group) for group in groups for flat in group["params"]]
        flats += [(flat, groups[0]) for flat in getattr(self.ds.optimizer, "fp32_partitioned_groups_flat", [])]
        for flat, group in flats:
            if not optimizer.state.get(flat):
                on_device = group.get("fused") or group.get("capturable")
                optimizer.state[flat] = {
                    "step": torch.zeros((), dtype=torch.float32, device=flat.device if on_device else "cpu"),
                    "exp_avg": torch.zeros_like(flat, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(flat, memory_format=torch.preserve_format),
                }
        link = getattr(self.ds.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None:  # ZeRO-1/2: what DeepSpeed calls after its first step (ZeRO-3 reads the state directly)
            link()

    def _loss_scale(self) -> float | None:
        """fp16: the dynamic loss scale of DeepSpeed's ZeRO optimizer (None otherwise)."""
        scaler = getattr(self.ds.optimizer, "loss_scaler", None)
        return float(scaler.cur_scale) if self.fp16 and scaler is not None else None

    def _client_optimizer(self) -> torch.optim.Optimizer:
        """The recipe's AdamW inside DeepSpeed's ZeRO optimizer (it steps the flat fp32 partitions)."""
        return self.ds.optimizer.optimizer

    def _client_group(self) -> dict[str, Any]:
        return self._client_optimizer().param_groups[0]

    def _client_step(self) -> torch.Tensor:
        states = list(self._client_optimizer().state.values())
        step = states[0]["step"] if states and "step" in states[0] else 0.0
        return torch.as_tensor(step, dtype=torch.float32).detach().cpu().reshape(())
