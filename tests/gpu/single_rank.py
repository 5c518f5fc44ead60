"""One rank of bigtrain, in this process, on a given device: the engine ``bigtrain train`` builds (``build_engine`` and
``train_step``), over a real one-rank process group (NCCL on CUDA, gloo on the CPU), so a test can set its weights,
step it and read them back. The GPU tier compares it step by step with a plain loop on the same device; the same
code on the CPU is each GPU test's CPU twin."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import recipe_engine
from torch.distributed.tensor import DTensor

from bigtrain.config.load import build_dataclass
from bigtrain.config.schema import RecipeConfig
from bigtrain.data.batch import MicroBatch
from bigtrain.engine import train_step
from bigtrain.engine.base import Engine
from bigtrain.models.build import load_hf_config

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-6, 0.1


@dataclass
class OneRank:
    engine: Engine
    plan: Any  # the resolved Plan
    cfg: RecipeConfig
    hf_config: Any
    device: torch.device

    def weights(self) -> dict[str, torch.Tensor]:
        """Every parameter by its HF name, whole and detached. Read from the modules, not ``engine.state_dict()``:
        torch's ``get_state_dict`` creates a fresh optimizer's state by stepping it with zero gradients, which
        counts as Adam's first step (its bias correction then differs on the real first step)."""
        built = self.engine.built
        out = {}
        for part in built.parts:
            for name, value in part.named_parameters():
                value = value.full_tensor() if isinstance(value, DTensor) else value
                if hasattr(value, "get_original_weight"):  # QLoRA's NF4 base, dequantised
                    value = value.get_original_weight()
                out[built.hf_name(name)] = value.detach().clone()
        return out

    def step(self, batch: torch.Tensor) -> tuple[float, float]:
        """One optimizer step on ``batch`` (rows of token ids) cut into the plan's micro-batches; (loss, grad norm)."""
        micro = [MicroBatch.of_ids(rows.to(self.device)) for rows in batch.split(self.plan.micro_batch_size)]
        tokens = float(batch[:, 1:].numel())
        loss_sum, result = train_step(self.engine, micro, tokens, self.cfg.train.grad_clip)
        return float(loss_sum) / tokens, float(result.grad_norm)


def recipe(model: dict[str, Any], parallel: dict[str, Any], **train: Any) -> dict[str, Any]:
    """A recipe for a one-rank engine: constant learning rate, AdamW as ``plain_loop_step`` writes it."""
    return {
        "model": model,
        "data": {"seq_len": 32},
        "train": {
            "global_batch_size": 8,
            "lr": LR,
            "lr_schedule": "constant",
            "warmup_steps": 0,
            "weight_decay": WD,
            "adam_beta1": BETAS[0],
            "adam_beta2": BETAS[1],
            "adam_eps": EPS,
            "grad_clip": 1.0,
            "seed": 0,
            **train,
        },
        "parallel": {"backend": "fsdp2", **parallel},
    }


@contextlib.contextmanager
def one_rank(raw: dict[str, Any], device: torch.device) -> Iterator[OneRank]:
    """bigtrain's engine for ``raw`` as rank 0 of 1 on ``device``; the process group lives while the context does."""
    cfg: RecipeConfig = build_dataclass(RecipeConfig, raw, "")
    backend = "nccl" if device.type == "cuda" else "gloo"
    with tempfile.NamedTemporaryFile() as store_file:
        dist.init_process_group(backend, store=dist.FileStore(store_file.name, 1), rank=0, world_size=1)
        try:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            hf_config = load_hf_config(cfg.model)
            engine, plan = recipe_engine(cfg, 1, hf_config, device)
            yield OneRank(engine, plan, cfg, hf_config, device)
        finally:
            dist.destroy_process_group()


class PlainLoop:
    """The reference: an HF model on the device, AdamW, ``clip_grad_norm_``, the summed cross-entropy over the global
    batch's labelled tokens over their count; ``prepare(model)`` changes the model first (torchao's float8 linears)."""

    def __init__(self, hf_config: Any, device: torch.device, dtype: torch.dtype = torch.float32, prepare=None) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype).to(device)
        if prepare is not None:
            prepare(self.model)
        self.model.train()
        self.device = device
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)

    @torch.no_grad()
    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self.model.load_state_dict({k: v.to(self.device) for k, v in weights.items()}, False)
        assert not unexpected, unexpected
        assert all(k == "lm_head.weight" for k in missing), missing  # tied: the head is the embedding

    def step(self, batch: torch.Tensor, clip: float = 1.0) -> tuple[float, float]:
        batch = batch.to(self.device)
        logits = self.model(input_ids=batch).logits[:, :-1].float()
        labels = batch[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")
        (loss / labels.numel()).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.opt.step()
        self.opt.zero_grad()
        return float(loss.detach()) / labels.numel(), float(norm)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def torchao_float8(recipe_name: str, emulate: bool):
    """``prepare`` for the reference: float8 linears made with torchao's own API, every linear but the LM head (the
    tiny model's widths are multiples of 16), dynamic scales of ``recipe_name``; ``emulate`` on the CPU (the real
    kernels' rounding), real FP8 matmuls on a GPU. No FSDP: the reference all-gathers nothing."""

    def prepare(model: torch.nn.Module) -> None:
        import dataclasses

        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe_name), emulate=emulate)
        convert_to_float8_training(model, config=config, module_filter_fn=lambda module, name: name != "lm_head")

    return prepare


def compare_step_by_step(
    bigtrain: OneRank, reference: PlainLoop, batches: list[torch.Tensor]
) -> list[dict[str, float]]:
    """Each step from identical weights: the reference is set to bigtrain's weights, both take the step on the same
    batch, and the step's loss, gradient norm and resulting parameters are compared. Returns per step the relative
    differences of loss and grad norm and the largest absolute parameter difference (the caller holds them to its
    tolerance), so that FP8's and compile's rounding cannot accumulate over steps into a meaningless bound."""
    out = []
    for batch in batches:
        reference.set_weights(bigtrain.weights())
        loss, norm = bigtrain.step(batch)
        ref_loss, ref_norm = reference.step(batch)
        mine, theirs = bigtrain.weights(), reference.weights()
        param = max(float((mine[k].float() - theirs[k].float().to(mine[k].device)).abs().max()) for k in mine)
        out.append(
            {
                "loss": loss,
                "loss_rel": abs(loss / ref_loss - 1),
                "grad_norm_rel": abs(norm / ref_norm - 1),
                "param_abs": param,
            }
        )
    return out


def token_batches(steps: int, vocab: int, rows: int = 8, seq_len: int = 32, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (rows, seq_len), generator=generator) for _ in range(steps)]
