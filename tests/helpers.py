"""Shared test helpers: tiny HF models saved locally, recipes on disk, running the real CLI in subprocesses."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from cases import TINY_LLAMA

REPO = Path(__file__).resolve().parents[1]


def save_reward_model(folder: Path, seed: int = 4) -> Path:
    """A tiny one-output Llama classifier with the byte tokenizer: a reward-model folder (grpo's reward_functions)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from bigtrain.data.tokenizer import save_byte_tokenizer

    spec = {**TINY_LLAMA, "vocab_size": 260}
    config = AutoConfig.for_model(spec.pop("model_type"), **spec, num_labels=1, pad_token_id=256)
    torch.manual_seed(seed)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    save_byte_tokenizer(folder)
    return folder


def save_tiny_model(folder: Path, seed: int = 0, spec: dict[str, Any] | None = None, **overrides: Any) -> Path:
    """Create a tiny randomly initialised HF causal LM and save it with save_pretrained (safetensors).

    ``spec`` is a whole config (with model_type) for another family; ``overrides`` change fields of TINY_LLAMA.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from bigtrain.config.hf import hf_config_from_dict

    spec = spec if spec is not None else {**TINY_LLAMA, **overrides}
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config_from_dict(spec), dtype=torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def make_plan(**fields: Any):
    """A Plan with FSDP2 defaults and ``fields`` changed, unresolved (for asking the capability table directly); the
    capability records' options at their defaults, as resolution and the search set them."""
    from bigtrain.config.capabilities import option_defaults
    from bigtrain.config.plan import Plan

    base = dict(
        backend="fsdp2",
        zero_stage=3,
        grad_reduce="once_per_step" if fields.get("pp", 1) > 1 else "every_micro_step",
        dp_replicate=1,
        dp_shard=1,
        tp=1,
        pp=1,
        pp_schedule="1f1b",
        activation_checkpointing="none",
        micro_batch_size=1,
        offload_optimizer=False,
        offload_params=False,
        options=option_defaults(),
    )
    own = {f.name for f in dataclasses.fields(Plan)}
    options = {k: v for k, v in fields.items() if k not in own}  # a record's option, as Plan.to_dict flattens it
    if options:
        fields = {k: v for k, v in fields.items() if k in own}
        base["options"] = tuple(sorted({**dict(option_defaults()), **options}.items()))
    return Plan(**{**base, **fields})


def check_fit(hf_config: Any, plan: Any, global_batch_size: int = 8, model: Any = None) -> None:
    """What start-up asks of the capability table for this model, plan and batch (raises its ConfigError), the job
    resolved as start-up resolves it (``model``: the recipe's model section, else a model.config one)."""
    from bigtrain.config.capabilities import ModelFacts, Setup, check
    from bigtrain.config.schema import ModelConfig, RecipeConfig, TrainConfig
    from bigtrain.job import resolve_job

    train = TrainConfig(global_batch_size=global_batch_size)
    job, hf_config = resolve_job(RecipeConfig(model=model or ModelConfig(config={}), train=train), hf_config)
    extra = job.task.model_facts(hf_config) if job.task.model_facts is not None else {}
    check(Setup(plan, train, ModelFacts.of(hf_config, **extra), job=job.facts))


def shuffled_global_batch(step: int, num_rows: int, batch: int, seed: int) -> np.ndarray:
    """The examples of optimizer step ``step`` in bigtrain's shuffled order, written independently: positions
    [step*B, (step+1)*B) of the epochs, each epoch a permutation seeded by seed + epoch."""
    out = []
    for position in range(step * batch, (step + 1) * batch):
        epoch, within = divmod(position, num_rows)
        out.append(np.random.default_rng(seed + epoch).permutation(num_rows)[within])
    return np.array(out)


def learnable_rows(num_rows: int, seq_len: int, vocab: int = 128) -> np.ndarray:
    """Token rows from a sparse random bigram chain (each token has 3 possible successors): a corpus a tiny model
    learns, so the loss keeps falling over a few steps and the late updates matter too."""
    rng = np.random.default_rng(0)
    successors = rng.integers(0, vocab, size=(vocab, 3))
    rows = np.empty((num_rows, seq_len), dtype=np.int64)
    rows[:, 0] = rng.integers(0, vocab, size=num_rows)
    for t in range(1, seq_len):
        rows[:, t] = successors[rows[:, t - 1], rng.integers(0, 3, size=num_rows)]
    return rows


def save_rows(
    path: Path, rows: np.ndarray | None = None, num_rows: int = 32, seq_len: int = 17, learnable: bool = False
) -> Path:
    """Token rows as the ``.npy`` that ``data.path`` reads: ``rows`` as given, else ``num_rows`` x ``seq_len`` ids
    below 128 (TINY_LLAMA's vocabulary): a learnable bigram chain, or seeded random ids."""
    if rows is None:
        random_ids = np.random.default_rng(0).integers(0, 128, size=(num_rows, seq_len))
        rows = learnable_rows(num_rows, seq_len) if learnable else random_ids
    np.save(path, rows)
    return Path(path)


def recipe_dict(
    output_dir: Path, data_path: str | Path, model: str | Path | dict[str, Any] | None = None, /, **sections: Any
) -> dict[str, Any]:
    """A recipe as the dict a test writes (``write_recipe``) or loads: ``model`` a local HF folder (a path), a
    ``model.config`` dict, or None for TINY_LLAMA from scratch; ``data_path`` the ``data.path``; each section
    (``data``, ``train``, ``parallel``, ``checkpoint``) merged key by key over what is already there. Keys left out
    keep the recipe's defaults."""
    if model is None or isinstance(model, dict):
        model_section: dict[str, Any] = {"config": dict(model if model is not None else TINY_LLAMA)}
    else:
        model_section = {"name_or_path": str(model)}
    base = {"model": model_section, "data": {"path": str(data_path)}, "output_dir": str(output_dir)}
    return with_sections(base, **sections)


def with_sections(recipe: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """``recipe`` with each section's keys changed (a section given as a dict is merged into the one there)."""
    out = dict(recipe)
    for key, value in sections.items():
        out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


def save_word_tokenizer(folder: Path) -> Path:
    """A tiny word-level HF tokenizer folder (4 ids, eos 0), made offline with the ``tokenizers`` library."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[EOS]": 0, "[UNK]": 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="[EOS]", unk_token="[UNK]").save_pretrained(folder)
    return folder


# ChatML with HF's {% generation %} markers around what the assistant says: transformers' own
# return_assistant_tokens_mask then gives an assistant mask independent of bigtrain's
CHATML_WITH_GENERATION = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}<|im_start|>assistant\n{% generation %}"
    "{{ message['content'] }}<|im_end|>\n{% endgeneration %}{% else %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def save_chat_tokenizer(folder: Path) -> Path:
    """bigtrain's byte tokenizer as an HF folder (259 ids: bytes, end of text, ChatML markers) whose chat template
    marks the assistant's text for HF's assistant-token mask."""
    from transformers import AutoTokenizer

    from bigtrain.data.tokenizer import save_byte_tokenizer

    save_byte_tokenizer(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = CHATML_WITH_GENERATION
    tok.save_pretrained(folder)
    return folder


def hf_assistant_mask(tokenizer_dir: Path, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of a conversation and transformers' own assistant-token mask for it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
COMMANDS_BLOCK = re.compile(r"<!-- commands:([\w-]+) -->\s*```bash\n(.*?)```", re.S)


def docs_blocks() -> dict[str, tuple[Path, list[str]]]:
    """Every named command block of README.md and docs/*.md (``<!-- commands:NAME -->`` before a bash fence): its
    file and its commands, a backslash-continued line joined, comments dropped."""
    found: dict[str, tuple[Path, list[str]]] = {}
    for path in DOCS:
        for name, body in COMMANDS_BLOCK.findall(path.read_text()):
            assert name not in found, f"commands:{name} is named twice"
            found[name] = (path, commands_of(body))
    return found


NEEDS_MARK = re.compile(r"#\s*needs (a GPU|\d+ GPUs|several machines)\s*$")


def commands_of(body: str, include_marked: bool = False) -> list[str]:
    """The commands of a bash block, a backslash-continued line joined, comment lines dropped, and (unless
    ``include_marked``) the lines marked ``# needs a GPU`` / ``# needs N GPUs`` / ``# needs several machines``,
    which no test on this machine can run."""
    joined = body.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or (NEEDS_MARK.search(line) and not include_marked):
            continue
        out.append(re.sub(r"\s+", " ", line.split(" # ")[0].strip()))
    return out


def docs_commands(name: str) -> list[str]:
    """The commands of the docs' block ``name``: what a test runs as the docs show it."""
    return docs_blocks()[name][1]


def write_recipe(path: Path, recipe: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def run_cli(args: list[str], timeout: float = 240, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m bigtrain ARGS`` in a fresh process (the real CLI, launcher included)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    return subprocess.run(
        [sys.executable, "-m", "bigtrain", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or REPO,
        env=env,
    )


def read_metrics(output_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(args: list[str], nproc: int = 2, module: bool = True, launcher_args: tuple[str, ...] = ()):
    """``torchrun --nproc-per-node N [LAUNCHER_ARGS] -m bigtrain ARGS`` (torch's launcher module, c10d rendezvous on
    loopback); with ``module=False``, ARGS start with a script to run instead of ``-m bigtrain``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        *launcher_args,
        *(["-m", "bigtrain"] if module else []),
        *args,
    ]


def run_torchrun(
    args: list[str],
    nproc: int = 2,
    timeout: float = 180,
    module: bool = True,
    launcher_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``torchrun_command(...)`` to the end, capturing its output; ``env`` adds variables for the launcher.

    Past ``timeout`` the launcher and its workers (one session) are killed, and the failure shows the end of what they
    printed: a hung rank is neither left running nor silent."""
    cmd = torchrun_command(args, nproc, module, launcher_args)
    full_env = {**os.environ, **(env or {})}
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=full_env, start_new_session=True
    ) as job:
        try:
            out, err = job.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            out, err = job.communicate()
            tails = f"stdout:\n{out[-2000:]}\nstderr:\n{err[-4000:]}"
            raise AssertionError(f"torchrun ran past {timeout} s and was killed with its workers; {tails}") from None
    return subprocess.CompletedProcess(cmd, job.returncode, out, err)


def recipe_engine(cfg: Any, world: int = 1, hf_config: Any = None, device: str = "cpu") -> tuple[Any, Any]:
    """(engine, plan) as ``bigtrain train`` builds them for the recipe ``cfg`` on ``world`` ranks, inside a process
    group that exists: the plan resolved, the model's config read (or ``hf_config``), AdamW and the train section's
    schedule."""
    import torch

    from bigtrain.config.resolve import resolve_plan
    from bigtrain.engine import build_engine, build_options
    from bigtrain.job import resolve_job
    from bigtrain.models.build import load_hf_config
    from bigtrain.train.optim import build_optimizer, build_scheduler

    job, hf_config = resolve_job(cfg, load_hf_config(cfg.model) if hf_config is None else hf_config)
    plan = resolve_plan(cfg.parallel, world, cfg.train, job.facts)
    engine = build_engine(
        build_options(cfg, hf_config, plan, torch.device(device)),
        cfg.train,
        lambda params: build_optimizer(params, cfg.train),
        lambda optimizer: build_scheduler(optimizer, cfg.train),
        objective=job.objective.make,
        roles=job.objective.attach,
    )
    return engine, plan


def quantize_adapted_bases(model: Any, nf4_shards: int) -> None:
    """A QLoRA reference's NF4 base, made with torchao's own API (not bigtrain's): every peft LoRA layer's base weight
    quantised from bf16 with torchao's blocks, 64 values a scale and 256 scales a second-level block, halved until
    every one of ``nf4_shards`` FSDP2 shards holds whole second-level blocks (only the tiny test widths need that)."""
    import torch
    from peft.tuners.lora import LoraLayer
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    for layer in [m for m in model.modules() if isinstance(m, LoraLayer)]:
        base = layer.get_base_layer()
        scales, scaler_block = base.weight.numel() // 64, 256
        while scaler_block > 1 and scales % (scaler_block * nf4_shards):
            scaler_block //= 2
        nf4 = to_nf4(base.weight.detach().to(torch.bfloat16), 64, scaler_block)
        base.weight = torch.nn.Parameter(nf4, requires_grad=False)
