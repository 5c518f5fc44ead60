"""grpo's reward functions (``train.reward_functions``): Python callables named by import path, ``module:function``,
with TRL's signature ``f(prompts, completions, completion_ids, **fields) -> list[float | None]``: the record's other
fields arrive as lists, one value per completion. None means "not scored by this function" (TRL's NaN: another
function scores it; a completion no function scores gets no advantage). A local folder of a one-output sequence
classifier (a reward model, e.g. ``model.task: reward-model``'s export) scores each prompt + completion as TRL's
GRPOTrainer does: the texts joined (a chat prompt and its completion through the folder's chat template), right-padded
with its tokenizer, the head's one output.

Everything that can be wrong is said in one line naming the function: a path that does not import, a value that is
not a number, a list of the wrong length, an exception (with the record that raised it, found by scoring the
completions one by one).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import numbers
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigtrain.errors import ConfigError

KEY = "train.reward_functions"


@dataclass(frozen=True)
class RewardFunction:
    path: str  # as the recipe wrote it, module:function
    function: Callable[..., Any]

    @property
    def name(self) -> str:
        """Its name in the metrics (``rewards/NAME/mean``, TRL's: the function's own name)."""
        return getattr(self.function, "__name__", self.path.rpartition(":")[2])


@contextlib.contextmanager
def _here_on_path() -> Iterator[None]:
    """The directory bigtrain starts in on the import path (``python -m`` has it there; a console script or
    torchrun's workers do not), as a user's reward module beside the recipe expects."""
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.append(here)
    try:
        yield
    finally:
        if added and here in sys.path:
            sys.path.remove(here)


@dataclass(frozen=True)
class Layout:
    """How reward models are laid out beside the policy: sharded over its FSDP2 ``mesh``, partitioned by DeepSpeed
    ZeRO-3 under its ``deepspeed_config``, else whole on each rank."""

    mesh: Any = None
    deepspeed_config: dict[str, Any] | None = None

    @property
    def sharded(self) -> bool:
        return self.mesh is not None or self.deepspeed_config is not None


WHOLE = Layout()


class RewardModel:
    """A reward-model folder as a reward function, in eval mode, in the dtype its weights were saved in
    (transformers' default, as TRL loads it), laid out as ``layout`` says: whole on each rank's device; sharded as
    an FSDP2 policy (each decoder block a unit gathered for its forward, then freed); or partitioned by an
    inference-only DeepSpeed ZeRO-3 engine (its hooks gather each module's parameters, as TRL's ``prepare_deepspeed``
    does for its reward and reference models). Sharded, every rank holds 1/N of it and all score together
    (``collective``: its forward's all-gathers)."""

    def __init__(self, folder: str, device: Any, layout: Layout = WHOLE) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.__name__ = Path(folder).name
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        if self.tokenizer.pad_token_id is None:  # TRL's rule: pad with eos
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True)
        self.model.eval()
        self.device = device
        self.collective = layout.sharded
        self.forward: Any = self.model
        if layout.deepspeed_config is not None:
            self.forward = _partitioned(self.model, layout.deepspeed_config)
            return
        self.model.to(device)
        if layout.mesh is not None:
            _shard(self.model, layout.mesh)

    def __call__(self, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]],
                 **fields: Any) -> list[float]:  # fmt: skip
        import torch

        if isinstance(prompts[0], list):  # chat: the conversation and the assistant's completion, templated
            texts = [
                self.tokenizer.apply_chat_template(p + c, tokenize=False)
                for p, c in zip(prompts, completions, strict=True)
            ]
        else:
            texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        inputs = self.tokenizer(
            text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
        )
        with torch.inference_mode():
            scores = self.forward(**{k: v.to(self.device) for k, v in inputs.items()}).logits[:, 0]
        return scores.float().cpu().tolist()


def _shard(model: Any, mesh: Any) -> None:
    """FSDP2 over ``mesh``: each of the model's blocks a unit (the units the policy's build finds, ``decoder_blocks``),
    then the rest."""
    from torch.distributed.fsdp import fully_shard

    from bigtrain.config.hf import decoder_blocks

    for _, _, block in decoder_blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _partitioned(model: Any, policy_config: dict[str, Any]) -> Any:
    """An inference-only DeepSpeed engine over ``model`` with the policy's ZeRO-3 settings: no optimizer or
    schedule, and DeepSpeed's dtype the one the weights were saved in (it would cast them to the policy's)."""
    import torch

    from bigtrain.roles.reference import inference_engine

    dtype = next(model.parameters()).dtype
    saved = {"bf16": {"enabled": dtype == torch.bfloat16}, "fp16": {"enabled": dtype == torch.float16}}
    engine = inference_engine(model, policy_config, **saved)
    engine.eval()
    return engine


def reward_model_bytes(paths: list[str]) -> int:
    """Bytes the reward-model folders among ``paths`` hold on each rank's device: their weights as saved (read from
    the safetensors headers, nothing loaded); module:function rewards hold none."""
    from bigtrain.config.weight_files import tensor_entries

    total = 0
    for path in paths:
        for file in sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []:
            total += sum(math.prod(shape) * _DTYPE_BYTES[dtype] for shape, dtype in tensor_entries(file))
    return total


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _reward_model(path: str, where: str, device: Any, layout: Layout) -> RewardFunction:
    """A folder as a reward function: refused unless it is a sequence classifier with one output; loaded where
    ``device`` is given (the run's, laid out as ``layout`` says), only checked otherwise (start-up, before any
    process group)."""
    import json

    config = Path(path) / "config.json"
    if not config.is_file():
        raise ConfigError(f"{where} is a folder without config.json; give a reward model's folder or module:function")
    read = json.loads(config.read_text())
    architectures = read.get("architectures") or []
    labels = len(read.get("id2label") or {}) or read.get("num_labels", 2)
    if not any(a.endswith("ForSequenceClassification") for a in architectures) or labels != 1:
        raise ConfigError(
            f"{where} is not a reward model (a sequence classifier with one output: its config names "
            f"{', '.join(architectures) or 'no architecture'} with {labels} labels); train one with model.task: "
            "reward-model, or give a module:function"
        )
    if device is None:
        return RewardFunction(path, lambda **_: [])
    return RewardFunction(path, RewardModel(path, device, layout))


def load_reward_function(path: str, index: int, device: Any = None, layout: Layout = WHOLE) -> RewardFunction:
    where = f"{KEY}[{index}]={path!r}"
    if Path(path).is_dir():
        return _reward_model(path, where, device, layout)
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"{where} is not module:function; name a callable by its import path, e.g. my_rewards:exact")
    try:
        with _here_on_path():
            module = importlib.import_module(module_name)
    except Exception as e:  # its own import error, or an error while the module runs
        raise ConfigError(
            f"{where}: module {module_name!r} does not import ({type(e).__name__}: {e}); put it on the Python path "
            "(PYTHONPATH, or the directory bigtrain is started from)"
        ) from e
    function = getattr(module, attribute, None)
    if function is None or not callable(function):
        found = "has no" if function is None else "has a non-callable"
        raise ConfigError(f"{where}: module {module_name!r} {found} {attribute!r}; name a function of it")
    return RewardFunction(path, function)


def load_reward_functions(paths: list[str], device: Any = None, layout: Layout = WHOLE) -> list[RewardFunction]:
    """The reward functions of ``paths``; reward-model folders loaded onto ``device`` (None: only checked) and laid
    out as ``layout`` says."""
    return [load_reward_function(path, i, device, layout) for i, path in enumerate(paths)]


def _values(reward: RewardFunction, out: Any, n: int, where: Callable[[int], str]) -> list[float]:
    """``out`` as n floats (NaN for None), or the one line that says what is wrong with it."""
    try:
        values = list(out)
    except TypeError:
        raise ConfigError(
            f"reward function {reward.path} returned {type(out).__name__}, not a list of {n} numbers (one per "
            "completion)"
        ) from None
    if len(values) != n:
        raise ConfigError(
            f"reward function {reward.path} returned {len(values)} values for {n} completions; return one per "
            "completion (None where it does not score one)"
        )
    floats = []
    for i, v in enumerate(values):
        if v is None:
            floats.append(math.nan)
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or (isinstance(v, float) and math.isnan(v)):
            raise ConfigError(
                f"reward function {reward.path} returned {v!r} for {where(i)}; return a number (or None: not scored)"
            )
        floats.append(float(v))
    return floats


def score(
    reward: RewardFunction,
    prompts: list[Any],
    completions: list[Any],
    completion_ids: list[list[int]],
    fields: dict[str, list[Any]],
    where: Callable[[int], str],
) -> list[float]:
    """One function's rewards of ``completions`` (NaN: not scored); ``where(i)`` names completion i's record."""
    n = len(completions)

    def call(rows: range) -> Any:
        cut = {k: [v[i] for i in rows] for k, v in fields.items()}
        return reward.function(
            prompts=[prompts[i] for i in rows],
            completions=[completions[i] for i in rows],
            completion_ids=[completion_ids[i] for i in rows],
            **cut,
        )

    try:
        out = call(range(n))
    except Exception as e:
        for i in range(n):  # which completion raised: score them one by one
            try:
                call(range(i, i + 1))
            except Exception as one:
                raise ConfigError(
                    f"reward function {reward.path} raised {type(one).__name__}: {one} on {where(i)}"
                ) from one
        raise ConfigError(f"reward function {reward.path} raised {type(e).__name__}: {e}") from e
    return _values(reward, out, n, where)
