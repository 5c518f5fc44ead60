"""How side_by_side.py drives each peer: its own trainer or recipe step where it has one, its own defaults otherwise.

- **torchtitan 0.2.2** (PyPI): its ``Trainer`` with its registry's Llama-3 flavour (``1B``, or ``8B`` with the layer
  list cut to the benchmark's depth), its default attention (FlexAttention, block-causal over the positions the data
  gives: one document per row, i.e. causal) and loss (``ChunkedLossWrapper`` over cross-entropy), FSDP2 with bf16
  compute and fp32 master weights (it always wraps, also on one GPU), per-block ``torch.compile``, its float8
  converter (``rowwise``, the recipe it offers; ``auto_filter_small_kn`` off, the output projection left out as in
  its configs) and CUDA graphs where it turns them on. Only the data is replaced: a dataloader of random token ids
  (no tokenizer or dataset exists offline). Each ``train_step`` call is timed between two CUDA synchronisations.
- **torchtune 0.6.1** (its last release; maintenance only): the model builders (``llama3_2_1b``,
  ``lora_llama3_2_1b`` with its LoRA recipe's defaults: rank 64, alpha 128, q/v/output projections and the MLP),
  ``CEWithChunkedOutputLoss`` and ``training.compile_model`` (per layer), driven by the body of its single-device
  recipes' ``train`` loop (forward, chunked loss, backward, clip, AdamW fused, zero_grad). The recipes keep the whole
  model and AdamW's states in bf16 (``dtype: bf16``), as here. Its import of torchao's NF4 module uses a path torchao
  0.18 moved; the module is aliased to its new place before the import.
- **HF Trainer** (transformers + accelerate as installed): ``Trainer`` with ``bf16=True`` (autocast over fp32
  parameters), ``torch_compile`` for the compile mode, the default optimizer (``adamw_torch_fused``), no
  checkpointing, ``max_grad_norm=1.0``; steps timed by a ``TrainerCallback``. On one GPU accelerate runs no FSDP, so
  this is the Trainer's single-device path.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from typing import Any

from shapes import MODELS, SHAPES, STEPS, TITAN_FLAVOURS, summary, timed_steps


def _random_ids(model: str, rows: int | None = None):
    import torch

    seq, batch = SHAPES[model]
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, MODELS[model]["vocab_size"], (rows or batch, seq), generator=generator)


def run_torchtitan(model: str, mode: str) -> dict[str, Any]:
    import dataclasses

    import torch
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.config import ConfigManager
    from torchtitan.models.llama3 import TransformerModelArgs
    from torchtitan.protocols.train_spec import get_train_spec, register_train_spec
    from torchtitan.tools.logging import init_logger
    from torchtitan.train import Trainer

    seq, batch = SHAPES[model]

    class RandomTokens(BaseDataLoader):
        """Random token ids, one row per sequence, as torchtitan's text loader yields them (input, labels)."""

        def __iter__(self):
            ids = _random_ids(model)
            while True:
                yield {"input": ids}, torch.roll(ids, -1, dims=1)

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            pass

    times: list[float] = []

    class TimedTrainer(Trainer):
        def train_step(self, data_iterator):  # noqa: ANN001 - torchtitan's signature
            torch.cuda.synchronize()
            start = __import__("time").perf_counter()
            out = super().train_step(data_iterator)
            torch.cuda.synchronize()
            times.append(__import__("time").perf_counter() - start)
            if len(times) == 4:  # the first steps' allocations (compilation) are not the steady peak
                torch.cuda.reset_peak_memory_stats()
            return out

    base = get_train_spec("llama3")
    width = MODELS[model]
    flavours = {  # its 8B flavour at the benchmark's depth; Llama-3.2-1B's widths in its own args (ffn 8192)
        "8B": dataclasses.replace(base.model_args["8B"], n_layers=width["num_hidden_layers"]),
        "1B": TransformerModelArgs(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.5,
                                   multiple_of=256, rope_theta=500000, vocab_size=width["vocab_size"]),
    }
    spec = dataclasses.replace(base, model_args=flavours, build_tokenizer_fn=None,
                               build_dataloader_fn=lambda **kwargs: RandomTokens())
    register_train_spec("bench_llama3", spec)
    init_logger()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    argv = [
        "--model.name", "bench_llama3", "--model.flavor", TITAN_FLAVOURS[model],
        "--job.dump_folder", tempfile.mkdtemp(),
        "--training.local_batch_size", str(batch), "--training.seq_len", str(seq), "--training.steps", str(STEPS),
        "--training.max_norm", "1.0", "--optimizer.lr", "1e-4", "--lr_scheduler.warmup_steps", "2",
        "--activation_checkpoint.mode", "none", "--metrics.log_freq", "1000",
    ]
    if mode != "eager":
        argv += ["--compile.enable"]
    if mode == "fp8":
        argv += ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.recipe_name", "rowwise",
                 "--quantize.linear.float8.filter_fqns", "output"]
    trainer = TimedTrainer(ConfigManager().parse_args(argv))
    try:
        trainer.train()
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return summary(model, times, settings="torchtitan 0.2.2 Trainer, sdpa, FSDP2 bf16/fp32")


TORCHTUNE_SITE = "/tmp/site_torchtune"  # setup_peers.sh installs torchao 0.12 there: torchtune 0.6.1 imports its API


def _import_torchtune():
    if os.path.isdir(TORCHTUNE_SITE):
        sys.path.insert(0, TORCHTUNE_SITE)
    try:
        importlib.import_module("torchao.dtypes.nf4tensor")
    except ImportError:
        new = importlib.import_module("torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
        sys.modules["torchao.dtypes.nf4tensor"] = new
    return importlib.import_module("torchtune")


def run_torchtune(model: str, mode: str, lora: bool = False) -> dict[str, Any]:
    import torch

    _import_torchtune()
    from torchtune import training
    from torchtune.models.llama3_2 import llama3_2_1b, lora_llama3_2_1b
    from torchtune.modules.loss import CEWithChunkedOutputLoss
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    if model != "llama-1b":
        raise ValueError("torchtune runs the 1B model only (its builders have no trimmed 8B)")
    torch.cuda.set_device(0)
    training.set_default_dtype(torch.bfloat16).__enter__()  # the recipes' dtype: bf16 for parameters and states
    with torch.device("cuda"):
        if lora:
            net = lora_llama3_2_1b(
                lora_attn_modules=["q_proj", "v_proj", "output_proj"],
                apply_lora_to_mlp=True,
                lora_rank=64,
                lora_alpha=128.0,
            )
            set_trainable_params(net, get_adapter_params(net))
        else:
            net = llama3_2_1b()
    loss_fn = CEWithChunkedOutputLoss()
    net.set_num_output_chunks(loss_fn.num_output_chunks)
    if mode == "compile":
        training.compile_model(net)
        loss_fn = training.compile_loss(loss_fn)
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-5, fused=True)
    ids = _random_ids(model).cuda()
    labels = torch.roll(ids, -1, dims=1)

    def step() -> None:
        logits = net(ids)
        loss = loss_fn(logits, labels)
        del logits
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    warm = timed_steps(step, 4)
    torch.cuda.reset_peak_memory_stats()
    times = warm + timed_steps(step, STEPS - 4)
    return summary(model, times, settings="torchtune builders + single-device recipe step, bf16 params and states")


def run_hf_trainer(model: str, mode: str) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(**{k: v for k, v in MODELS[model].items() if k != "model_type"})
    net = LlamaForCausalLM(config)
    ids = _random_ids(model, rows=SHAPES[model][1] * STEPS)
    rows = [{"input_ids": row, "labels": row} for row in ids]
    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - transformers' signature
            torch.cuda.synchronize()
            self.start = __import__("time").perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            torch.cuda.synchronize()
            times.append(__import__("time").perf_counter() - self.start)
            if len(times) == 4:
                torch.cuda.reset_peak_memory_stats()

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=SHAPES[model][1],
        max_steps=STEPS,
        learning_rate=1e-4,
        max_grad_norm=1.0,
        bf16=True,
        torch_compile=mode == "compile",
        save_strategy="no",
        logging_steps=1000,
        report_to=[],
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=net, args=args, train_dataset=rows, callbacks=[StepTimer()])
    trainer.train()
    return summary(model, times, settings="HF Trainer single GPU, bf16 autocast over fp32 params, sdpa")


RUNNERS = {
    "torchtitan": run_torchtitan,
    "torchtune": run_torchtune,
    "torchtune-lora": lambda model, mode: run_torchtune(model, mode, lora=True),
    "hf-trainer": run_hf_trainer,
}
