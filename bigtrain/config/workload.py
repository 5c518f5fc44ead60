"""The workload: what one optimizer step processes and how, apart from the model and the plan.

The planner's estimates, its search, ``plan: auto`` and the simulator take this one value instead of loose
arguments, so that a new train-level option that changes memory or time (adapters, FP8) is one new field here, not a
new parameter of every function. The capability table (``capabilities/``) reads the same options from the recipe's
``train`` section (``train_config``): a workload and a recipe ask the same questions of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bigtrain.config.schema import ADAPTER_METHODS, METHODS, PRECISIONS, AdapterConfig, TrainConfig
from bigtrain.config.setup import DataFacts, JobFacts


@dataclass(frozen=True)
class Generation:
    """What each step generates before it trains (online RL's rollouts, ``train.objective: grpo``): every
    data-parallel rank generates its share of the global batch's completions at once, with a KV cache, on the
    policy's own weights; a completion is at most ``completion_len`` tokens after a prompt of ``prompt_len`` (the
    workload's ``seq_len`` is their sum: the rows it then trains on). A generation is trained on ``num_iterations``
    times (TRL's mu): its cost per step is shared by as many steps."""

    prompt_len: int
    completion_len: int
    num_generations: int = 8
    num_iterations: int = 1
    # the rollouts' own models for the whole run: the reward-model folders' saved weights, whole (a rank holds its
    # share: planner/rollout_memory.reward_model_share)
    resident_bytes: int = 0

    def rows(self, global_batch_size: int, dp: int) -> int:
        """Completions one data-parallel rank generates at once."""
        return max(global_batch_size // dp, 1)


@dataclass(frozen=True, kw_only=True)
class Workload:
    seq_len: int  # tokens per sequence
    global_batch_size: int  # sequences per optimizer step, over every data-parallel rank and micro-step
    mixed_precision: str = "bf16"  # compute dtype: fp32, bf16 or fp16 (train.mixed_precision)
    compile: bool | str = False  # train.compile: torch.compile the blocks and the loss; "auto": the planner decides
    fp8: str = "none"  # train.fp8: float8 matmuls in the blocks' linears (tensorwise, rowwise; auto: the planner)
    method: str = "full"  # train.method: full, lora, qlora, or auto (the planner chooses)
    lora_rank: int = 16  # lora.r: the adapters' rank under lora and qlora
    modules_to_save: tuple[str, ...] = ()  # lora.modules_to_save: modules trained fully beside the adapters
    packed: bool = False  # data.packing: documents (what context parallelism cannot keep apart yet)
    attention: str = "sdpa"  # model.attn_implementation (what context parallelism can wrap)
    image_size: int = 0  # pixels per side of a classifier's or a vision-language model's images (0: none, default)
    images_per_row: float = 1.0  # a vision-language model's images per row (a mean)
    frozen: tuple[str, ...] = ()  # model.freeze: the parts of a vision-language model that do not train
    # the job's task and objective as the planner reads them (``JobFacts``: a preference objective's global batch
    # counts pairs of two rows each; its reference is a role the search places)
    job: JobFacts = JobFacts()
    # passes the run makes over its data: a precomputed reference's one pass, per step (planner/preference.py)
    epochs: float = 1.0
    # what each step generates before it trains (grpo's rollouts); None: the step reads its rows from data
    generation: Generation | None = None

    def __post_init__(self) -> None:
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"mixed_precision {self.mixed_precision!r} is not one of {PRECISIONS}")
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is not one of {METHODS}")

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one value in the compute dtype (fp16 and bf16: 2, fp32: 4)."""
        return 4 if self.mixed_precision == "fp32" else 2

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step."""
        return self.seq_len * self.global_batch_size

    @property
    def objective(self) -> str:
        """train.objective, resolved (the job's)."""
        return self.job.objective

    @property
    def adapters(self) -> bool:
        """Whether a frozen base is trained through adapters (lora, qlora)."""
        return self.method in ADAPTER_METHODS

    def data_facts(self) -> DataFacts:
        """What the capability table's data rows read of this workload."""
        return DataFacts(self.seq_len, self.packed, self.attention)

    @classmethod
    def of_train(
        cls,
        train: TrainConfig,
        seq_len: int,
        lora: AdapterConfig | None = None,
        packed: bool = False,
        attention: str = "sdpa",
        epochs: float = 1.0,
        job: JobFacts | None = None,
    ) -> Workload:
        """A recipe's workload: its ``train`` section, the sequence length its data has, its ``lora`` section, and
        how its data is read (packed documents, the attention implementation), and the job's facts (its specs')."""
        lora = lora or AdapterConfig()
        return cls(
            seq_len=seq_len,
            global_batch_size=train.global_batch_size,
            mixed_precision=train.mixed_precision,
            compile=train.compile,
            fp8=train.fp8,
            method=train.method,
            lora_rank=lora.r,
            modules_to_save=tuple(lora.modules_to_save or ()),
            packed=packed,
            attention=attention,
            job=job or JobFacts(),
            epochs=epochs,
        )

    def train_config(self, **fields: Any) -> TrainConfig:
        """The recipe ``train`` section this workload stands for (other keys at their defaults, or ``fields``)."""
        return TrainConfig(
            global_batch_size=self.global_batch_size,
            mixed_precision=self.mixed_precision,
            compile=self.compile,
            fp8=self.fp8,
            method=self.method,
            objective=self.job.objective,
            **fields,
        )
