"""What another trainer needs to train exactly what ``bigtrain train`` trains on a recipe: the rows in bigtrain's
order, its labels, its learning-rate schedule and its weight decay.

The HF Trainer, TRL and a plain accelerate loop differ from bigtrain by library defaults, each of which changes the
model trained (checked by tests/integration/test_api_routes.py):
- order: the Trainer shuffles with its own sampler; bigtrain reads ``GlobalOrder`` (``data/order.py``). Hand the
  rows over in bigtrain's order (``step_order``) with ``train_sampling_strategy="sequential"``.
- warmup: transformers' schedules give step ``s`` of ``W`` warmup steps ``s / W`` of the rate (the first step
  trains at 0); bigtrain gives ``(s + 1) / W``. Its cosine ends at the last step, transformers' one step later.
  ``train.optim.build_scheduler`` is bigtrain's schedule (a ``LambdaLR``).
- weight decay: the Trainer leaves biases and norm weights undecayed; bigtrain's AdamW decays every parameter.
- labels: bigtrain's rows hold labels already shifted by one; HF's loss shifts them itself (``hf_examples``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bigtrain.config.schema import RecipeConfig, TrainConfig
from bigtrain.data import TokenRows, load_token_rows
from bigtrain.data.labels import IGNORE_INDEX
from bigtrain.data.order import GlobalOrder
from bigtrain.data.sources import hold_out
from bigtrain.errors import ConfigError
from bigtrain.runtime import finish_collectives
from bigtrain.train.optim import build_scheduler


def step_order(num_rows: int, cfg: RecipeConfig) -> np.ndarray:
    """Row indices in the order ``bigtrain train`` reads them, step after step over ``train.steps`` steps (a
    global batch per step): hand them to a trainer that reads its data sequentially."""
    order = GlobalOrder(num_rows, cfg.train.global_batch_size, cfg.data.shuffle, cfg.train.seed)
    return np.concatenate([order.global_batch(step) for step in range(cfg.train.steps)])


def training_rows(cfg: RecipeConfig) -> TokenRows:
    """The recipe's training rows as bigtrain reads them (its held-out fraction left out)."""
    if cfg.data.sources:
        raise ConfigError(
            "data.sources blends its sources in bigtrain train's own order; the HF Trainer, TRL and accelerate routes "
            "read one source in row order: give data.path (or train with bigtrain train)"
        )
    data = load_token_rows(cfg.data)
    if cfg.data.eval_path is None and cfg.data.eval_fraction > 0:
        data, _ = hold_out(data, cfg.data.eval_fraction, cfg.train.seed)
    return data


def hf_examples(data: TokenRows, rows: np.ndarray) -> list[dict[str, torch.Tensor]]:
    """The rows (in the given order) as HF examples with the same labels: bigtrain's already-shifted labels
    (IGNORE_INDEX on prompts, padding, ...) move one position right, since HF's loss shifts them itself; packed
    documents keep their restarting position ids."""
    out = []
    for i in rows:
        batch = data.micro_batch(np.array([i]))
        labels = torch.cat([torch.tensor([IGNORE_INDEX]), batch.labels[0, :-1]])
        example = {"input_ids": batch.input_ids[0], "labels": labels}
        if batch.position_ids is not None:
            example["position_ids"] = batch.position_ids[0]
        out.append(example)
    return out


def aligned_trainer(trainer_cls: type, train: TrainConfig) -> type:
    """``trainer_cls`` (``transformers.Trainer`` or TRL's ``SFTTrainer``) with bigtrain's weight decay (every
    parameter) and learning-rate schedule in place of the library's defaults; all else is the library's."""

    class Aligned(trainer_cls):  # type: ignore[misc, valid-type]
        def get_decay_parameter_names(self, model: torch.nn.Module) -> list[str]:
            return [name for name, _ in model.named_parameters()]

        def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
            if self.lr_scheduler is None:
                self.lr_scheduler = build_scheduler(optimizer or self.optimizer, train)
            return self.lr_scheduler

    Aligned.__name__ = Aligned.__qualname__ = f"{trainer_cls.__name__}AlignedWithBigtrain"
    return Aligned


def plan_this_job(cfg: RecipeConfig) -> Any:
    """``bigtrain.plan`` for the recipe on the job this script runs in, its table printed once (rank 0). On CPUs the
    plan is pinned to ddp: DDP is what the Trainer, TRL and accelerate run there (their FSDP and DeepSpeed need
    GPUs)."""
    from bigtrain.api.planning import plan
    from bigtrain.runtime import read_launch_env

    result = plan(recipe=cfg, fix=None if torch.cuda.is_available() else {"backend": "ddp"})
    if read_launch_env().rank == 0:
        print(result.explain())
    return result


def save_final_weights(model: torch.nn.Module, output_dir: str) -> str:
    """The trained weights as one safetensors file in ``output_dir`` (tied weights stored once), for comparison
    with ``bigtrain train``'s final model; its path."""
    from pathlib import Path

    from safetensors.torch import save_model

    path = Path(output_dir) / "final_weights.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(model, str(path))
    return str(path)


def summary_line(
    result: Any,
    distributed_type: Any,
    world_size: int,
    losses: list[float],
    check: Any,
    grad_norms: list[float] | None = None,
    weights: str | None = None,
) -> str:
    """The JSON line a script ends with: how it ran, the plan, the loss and gradient norm (before clipping) of each
    step, where its final weights are and the memory check's line (what tests/integration/test_api_routes.py
    compares with bigtrain train's run)."""
    import json

    return json.dumps(
        {
            "distributed_type": str(distributed_type),
            "world_size": world_size,
            "plan": result.plan.to_dict(),
            "losses": losses,
            "grad_norms": grad_norms or [],
            "weights": weights,
            "memory_check": check.line() if check is not None else None,
        }
    )


def end_training(accelerator: Any) -> None:
    """Tear the process group down once every rank's collectives are done, while Python is whole (see
    ``runtime.finish_collectives``): a finished run neither hangs nor aborts on its way out."""
    if accelerator.num_processes > 1:
        finish_collectives()
    accelerator.end_training()
