"""The recipe schema: one dataclass per recipe section, each field documented where it is declared.

A recipe is YAML whose top-level keys are ``model``, ``data``, ``train``, ``parallel``, ``checkpoint``, ``lora`` and
``output_dir``. ``load.py``
turns it (plus ``--set`` overrides) into a :class:`RecipeConfig`, rejecting unknown keys and wrong types by their dotted
name. Fields whose default is ``None`` are derived later (from the model, the data or the world size).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from bigtrain.config.diffusion_keys import DiffusionKeys
from bigtrain.config.embedding_keys import EmbeddingKeys
from bigtrain.config.image_keys import ImageDataKeys
from bigtrain.config.online_rl import GrpoKeys, RolloutConfig
from bigtrain.config.schema_fields import doc, recipe_key

__all__ = ["RecipeConfig", "TrainConfig", "doc", "recipe_key"]

MixedPrecision = Literal["fp32", "bf16", "fp16"]
Backend = Literal["ddp", "fsdp2", "deepspeed"]
Checkpointing = Literal["none", "selective", "full"]
GradReduce = Literal["every_micro_step", "once_per_step"]
DataFormat = Literal["auto", "text", "chat", "instruction"]
Packing = Literal["stream", "documents", "pad"]
LogTo = Literal["jsonl", "tensorboard", "wandb", "mlflow", "trackio"]
Method = Literal["full", "lora", "qlora", "auto"]
Fp8 = Literal["none", "tensorwise", "rowwise", "auto"]
LossType = Literal["sigmoid", "hinge", "grpo", "dr_grpo", "dapo", "bnpo"]
PipelineSchedule = Literal[
    "1f1b", "gpipe", "interleaved_1f1b", "looped_bfs", "interleaved_zero_bubble", "zbv_zero_bubble", "dual_pipe_v"
]

# The spelled-out choices, for code that enumerates or prints them (argparse choices, the planner's search).
PRECISIONS: tuple[str, ...] = get_args(MixedPrecision)
BACKENDS: tuple[str, ...] = get_args(Backend)
CHECKPOINTING: tuple[str, ...] = get_args(Checkpointing)
GRAD_REDUCE: tuple[str, ...] = get_args(GradReduce)
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
METHODS: tuple[str, ...] = get_args(Method)
FP8_CHOICES: tuple[str, ...] = get_args(Fp8)
ADAPTER_METHODS: tuple[str, ...] = ("lora", "qlora")


@dataclass
class ModelConfig:
    name_or_path: str | None = doc("Local HuggingFace model folder (config.json + safetensors weights).", default=None)
    config: dict[str, Any] | None = doc(
        "Config dict for AutoConfig.for_model (needs model_type); the model is built from scratch with its own init.",
        default=None,
    )
    attn_implementation: str = doc(
        "HF attention implementation: auto (the family's own default: sdpa where transformers supports it for the "
        "family, else eager), sdpa, eager, flash_attention_2 (where installed), flex_attention.",
        default="auto",
    )
    task: str = doc(
        "What the model is trained to do: auto (from the config's architectures, else causal-lm for a decoder "
        "family and the one task transformers serves otherwise: image-classification for ResNet/ViT/ConvNeXt, "
        "sequence-classification for BERT-like encoders, image-text-to-text for a config with a vision tower), "
        "causal-lm, image-classification, sequence-classification, image-text-to-text (vision-language chat models).",
        default="auto",
    )
    freeze: list[str] = doc(
        "Parts that do not train (image-text-to-text): vision_tower, projector, language_model, resolved to the "
        "family's own modules (Qwen2.5-VL's visual, Idefics3's connector, ...), or the model's own module names. "
        "Their weights stay bit-identical.",
        default_factory=list,
    )
    trust_remote_code: bool = doc(
        "Allow a model folder whose config names its own Python code (auto_map) to run that code when its config "
        "is read (transformers' trust_remote_code). bigtrain trains the families transformers ships; a model of "
        "its own code is refused either way, with or without running it.",
        default=False,
    )


@dataclass
class CoreDataKeys:
    path: str = doc(
        "Tokenised .npy [num_sequences, seq_len], token .bin (flat ids of data.token_dtype, or Megatron's .bin with "
        "its .idx), .jsonl (one record per line), .txt, a local HF dataset (a "
        "save_to_disk folder, .parquet/.arrow/.json files, a folder of them or a glob), or 'builtin:stories' "
        "(generated, no download).",
        default="builtin:stories",
    )
    format: DataFormat = doc(
        "What a record is: text (data.text_field), chat ({'messages': [{'role', 'content'}, ...]}, rendered with the "
        "tokenizer's chat template, loss on the assistant turns only) or instruction ({'prompt', 'completion'}, loss "
        "on the completion only); auto: chat if the first record has messages, instruction if it has prompt and "
        "completion, else text.",
        default="auto",
    )
    packing: Packing | None = doc(
        "How records become rows of seq_len: stream (concatenate and cut; documents see each other, the pre-training "
        "convention), documents (whole records packed into rows, attention kept inside each record, longer records "
        "truncated) or pad (one record per row, padded: each micro-batch only to its longest row, a multiple of 8, "
        "as the HF Trainer's collators do; to seq_len under pp, cp, compile or a mixture's router loss, which need "
        "one length). Unset: stream for text, documents for chat/instruction.",
        default=None,
    )
    split: str = doc("The split of a HF dataset with several (a DatasetDict folder).", default="train")
    sources: list[dict] = doc(
        "Several sources blended by weight into one global order (instead of data.path), each a mapping: path (any "
        "form data.path takes), and weight (shares, normalised) or epochs (how often it is seen per blended epoch; "
        "default 1: the sources in proportion to their rows). The order is the same at any world size and resumes "
        "at once; e.g. [{path: web.bin, weight: 0.7}, {path: code.jsonl, weight: 0.3}].",
        default_factory=list,
    )
    streaming: bool = doc(
        "Read data.path as a HF dataset in streaming mode (local files, a folder, a glob, a save_to_disk folder, or a "
        "dataset name or URL datasets.load_dataset streams from): records are tokenised and packed as training goes, "
        "in the stream's order (data.shuffle does not apply), by every rank, so the order is the same at any world "
        "size; the position in the stream is saved in each checkpoint and a resume opens the stream there. For a "
        "corpus not on local disk in full; a local one is faster through the data cache (bigtrain prepare).",
        default=False,
    )
    eval_path: str | None = doc(
        "Held-out data for evaluation, in any form data.path takes (same format, tokenizer and seq_len).",
        default=None,
    )
    eval_fraction: float = doc(
        "Hold out this fraction of data.path's rows (a seeded choice) for evaluation instead of data.eval_path.",
        default=0.0,
    )
    seq_len: int | None = doc(
        "Tokens per training sequence; for .npy it defaults to (and must equal) its width. Preference pairs: the "
        "longest prompt + answer (TRL's max_length); a longer answer is cut at its end.",
        default=None,
    )
    max_prompt_length: int | None = doc(
        "Preference pairs and grpo's prompts: keep at most this many tokens of each prompt, its end (TRL's "
        "max_prompt_length); "
        "unset: whole prompts (a prompt that leaves no room for an answer in data.seq_len is refused).",
        default=None,
    )
    shuffle: bool = doc("Shuffle the global order each epoch with a permutation seeded by train.seed.", default=True)
    tokenizer: str | None = doc(
        "Local HF tokenizer folder for .jsonl/.txt; unset: the model folder's own tokenizer when it ships one, "
        "else the built-in byte-level tokenizer (257 ids).",
        default=None,
    )
    text_field: str = doc("Field of each .jsonl object that holds the text.", default="text")
    token_dtype: Literal["uint16", "uint32", "int32", "int64"] = doc(
        "A flat token file (a .bin without Megatron's .idx beside it: every document's ids one after another, as "
        "nanoGPT writes them): the dtype of its ids (a Megatron .idx names its own).",
        default="uint16",
    )
    cache_dir: str | None = doc(
        "Where records are kept tokenised and packed (built once, keyed by a fingerprint of the data files, the "
        "tokenizer, format, packing and seq_len; every rank, restart and later run maps the same files); unset: "
        "HF datasets' cache (HF_DATASETS_CACHE, else HF_HOME/datasets), in a bigtrain folder.",
        default=None,
    )
    workers: int = doc(
        "DataLoader worker processes that read (decode, tokenise, augment) the next steps' micro-batches while the "
        "current one trains, per rank; 0: read in the training process when the step asks. The order and the "
        "augmentation are the same either way. Each step's wait for its data is data_s in metrics.jsonl.",
        default=0,
    )
    label_field: str = doc(
        "Classification: the field (or HF dataset column) holding each example's label, a class name or an index.",
        default="label",
    )


@dataclass
class DataConfig(ImageDataKeys, CoreDataKeys):
    """The ``data`` section: the core keys, then the image keys (``config/image_keys.py``)."""


@dataclass
class CoreTrainKeys:
    steps: int = doc("Optimizer steps to run.", default=100)
    global_batch_size: int = doc(
        "Sequences per optimizer step, over all data-parallel ranks and micro-steps.", default=8
    )
    lr: float = doc("Peak learning rate of AdamW.", default=3e-4)
    lr_schedule: Literal["constant", "cosine"] = doc(
        "Shape after warmup: constant, or cosine down to min_lr_ratio·lr.", default="cosine"
    )
    warmup_steps: int = doc("Steps of linear warmup from lr/warmup_steps up to lr.", default=0)
    min_lr_ratio: float = doc("Cosine floor as a fraction of lr.", default=0.1)
    weight_decay: float = doc("AdamW decoupled weight decay.", default=0.0)
    adam_beta1: float = doc("AdamW beta1.", default=0.9)
    adam_beta2: float = doc("AdamW beta2.", default=0.95)
    adam_eps: float = doc("AdamW epsilon.", default=1e-8)
    grad_clip: float = doc(
        "Clip the global gradient norm to this value; 0 disables clipping (the norm is still logged).", default=1.0
    )
    mixed_precision: MixedPrecision = doc(
        "Compute dtype: fp32, bf16, or fp16 with dynamic loss scaling.", default="fp32"
    )
    fp16_initial_scale: float = doc(
        "Initial loss scale under fp16; halved on every overflow, doubled after 2000 clean steps.", default=65536.0
    )
    label_smoothing: float = doc(
        "Classification: cross-entropy label smoothing (torch's label_smoothing), 0 to 1. dpo (loss_type sigmoid): "
        "the probability that a pair's preference is flipped (conservative DPO; TRL 1.16's sigmoid has none), 0 to "
        "0.5.",
        default=0.0,
    )
    objective: str = doc(
        "What is minimised (bigtrain/objectives: one spec each): auto (the task's own: sft for token rows, "
        "classification for a classifier), sft (next-token cross-entropy on the labelled tokens), classification "
        "(cross-entropy over examples), or a preference objective on prompt/chosen/rejected pairs "
        "(docs/preference.md): dpo, ipo (both measured against a reference model, parallel.reference), orpo or simpo "
        "(reference-free), or reward (a reward model's Bradley-Terry loss, model.task reward-model). "
        "train.global_batch_size then counts pairs, and the loss is the mean over the global batch's pairs. grpo: "
        "online RL on prompts (docs/rl.md): completions generated by the policy and scored by reward functions; "
        "train.global_batch_size counts completions.",
        default="auto",
    )
    beta: float | None = doc(
        "Preference objectives, TRL's beta: dpo's and simpo's inverse temperature, ipo's regularisation (tau in its "
        "paper), orpo's weight of the odds-ratio term (lambda in its paper); grpo: the weight of the KL to the "
        "reference model (0: no reference is loaded). Unset: TRL's default of the objective (0.1; grpo 0).",
        default=None,
    )
    loss_type: LossType | None = doc(
        "dpo: sigmoid (the paper's -log sigmoid(beta * margin)) or hinge (SLiC's max(0, 1 - beta * margin)). grpo: "
        "how the token losses are normalised: dapo (by the global batch's completion tokens), grpo (each "
        "completion's token mean, then the mean over completions), dr_grpo (by completions x "
        "max_completion_length) or bnpo (by each micro-batch's tokens, TRL's meaning: it depends on "
        "parallel.micro_batch_size). Unset: TRL's default (dpo sigmoid, grpo dapo).",
        default=None,
    )
    simpo_gamma: float = doc("simpo: the target reward margin gamma (TRL's simpo_gamma).", default=0.5)
    center_rewards_coefficient: float = doc(
        "reward (model.task reward-model): the weight of (r_chosen + r_rejected)^2 beside the Bradley-Terry loss, "
        "which keeps rewards centred on 0 (TRL's center_rewards_coefficient; 0: off, 0.01 suggested).",
        default=0.0,
    )
    seed: int = doc("Seed of the data order and of from-scratch initialisation.", default=0)
    compile: bool | Literal["auto"] = doc(
        "torch.compile each decoder block (after tp and activation checkpointing, before FSDP2, as torchtitan does) "
        "and the loss; the first steps pay the compilation. auto: the planner turns it on where it predicts a faster "
        "step (decided when the job plans, as train.method auto).",
        default=False,
    )
    fp8: Fp8 = doc(
        "FP8 matmuls in the decoder blocks' linear layers (torchao float8 training): tensorwise (one scale per "
        "tensor; under FSDP2 on CUDA the weights are also all-gathered in FP8) or rowwise scaling (one per row). The "
        "LM head, a mixture's router and linears with a dimension that is not a multiple of 16 stay in the compute "
        "dtype. Runs on GPUs with FP8 tensor cores (H100, H200, B200, L40S, L4); elsewhere torchao emulates it "
        "(slower: for tests). Backends ddp and fsdp2; not with tp, pp or adapters yet. auto: the planner picks none, "
        "tensorwise or rowwise by its predicted step, FP8 only where a bigtrain probe profile "
        "(parallel.hardware_profile) measured FP8 matmuls: the datasheet overstates FP8's gain at small widths.",
        default="none",
    )
    method: Method = doc(
        "What is trained: full (every parameter), lora (low-rank adapters on a frozen base in the compute dtype; "
        "the lora section), qlora (the same on a 4-bit NF4 base, computing in bf16) or auto (the planner picks full "
        "fine-tuning when it fits at a competitive speed, else lora, else qlora).",
        default="full",
    )
    eval_every: int = doc(
        "Evaluate every this many optimizer steps (and after the last); 0: only after the last. Needs "
        "data.eval_path or data.eval_fraction.",
        default=0,
    )
    log_to: LogTo = doc(
        "metrics.jsonl is always written; a tracker gets the same numbers, on this machine: tensorboard (event "
        "files in output_dir/tensorboard), wandb (an offline run in output_dir/wandb; wandb sync uploads it), "
        "mlflow (the SQLite store output_dir/mlflow.db) or trackio (its local store; trackio show). Each needs its "
        "package (pip install bigtrain[NAME]).",
        default="jsonl",
    )
    collective_timeout_s: int = doc(
        "Seconds a collective may wait before the job fails instead of hanging.", default=600
    )


@dataclass
class TrainConfig(DiffusionKeys, EmbeddingKeys, GrpoKeys, CoreTrainKeys):
    """The ``train`` section: every job's keys, then grpo's (online_rl.py), the contrastive's and flow matching's."""


@dataclass
class ParallelConfig:
    plan: Literal["manual", "auto"] = doc(
        "'manual' uses the fields below; 'auto' lets the planner choose.", default="manual"
    )
    backend: Backend = doc(
        "Data-parallel engine: ddp, fsdp2 (torch fully_shard) or deepspeed (ZeRO through deepspeed.initialize; "
        "docs/running.md).",
        default="fsdp2",
    )
    zero_stage: int | None = doc(
        "fsdp2: 3 reshards parameters after forward, 2 keeps them until backward ends. deepspeed: ZeRO stage 1, 2 or "
        "3. ddp: 0. Unset: 3 for fsdp2 and deepspeed, 0 for ddp.",
        default=None,
    )
    grad_reduce: GradReduce | None = doc(
        "When gradients are reduced across data-parallel ranks during accumulation: every_micro_step "
        "(reduce-scatter after each micro-batch, gradients stay sharded, 4 bytes/param / dp_shard between "
        "micro-steps; the fsdp2 and deepspeed default) or once_per_step (only after the last micro-batch: 1/accum "
        "of the traffic, but unsharded fp32 gradients in between, 4 bytes/param of the whole model; ddp and "
        "pipeline stages always). HSDP defers its cross-replica all-reduce to the last micro-step either way.",
        default=None,
    )
    dp_replicate: int | None = doc(
        "Replicated data-parallel degree (HSDP's outer dimension: e.g. the number of nodes); unset: 1 for fsdp2, "
        "the whole data-parallel world for ddp.",
        default=None,
    )
    dp_shard: int | None = doc(
        "Sharded data-parallel degree; unset: whatever the other degrees leave of the world.", default=None
    )
    tp: int = doc(
        "Tensor-parallel degree (backend fsdp2): every attention and MLP projection split over tp consecutive ranks "
        "with the model's own transformers layout (base_model_tp_plan: Llama, Mistral, Qwen2 and relatives); must "
        "divide the query and KV heads. See recipes/tp_fsdp.yaml.",
        default=1,
    )
    loss_parallel: bool = doc(
        "tp > 1: shard the LM head over the vocabulary on the tp ranks and compute the cross-entropy on the shards "
        "(torch's loss_parallel), so each rank holds 1/tp of the logits (16 bytes per local logit against 12 per "
        "full logit without it: it saves memory from tp=2 on); needs an untied LM head and a vocabulary tp divides; "
        "not with pp yet.",
        default=False,
    )
    sequence_parallel: bool = doc(
        "tp > 1: also split the sequence over the tp ranks between the projections (norms, residual stream; "
        "Megatron-LM's sequence parallelism with torch's SequenceParallel): their activations shrink by tp, and "
        "each block's all-reduces become an all-gather and a reduce-scatter (a seq_len that tp does not divide "
        "is split unevenly, which DTensor pads). Combines with loss_parallel; not with pp yet.",
        default=False,
    )
    cp: int = doc(
        "Context-parallel degree (backend fsdp2 or ddp): each row's sequence split into cp contiguous slices on cp "
        "ranks, which exchange heads for sequence around attention (all-to-all, DeepSpeed-Ulysses' form), so every "
        "rank holds 1/cp of each block's activations; FSDP2 shards parameters over dp_shard x cp. Must divide the "
        "attention and KV heads and the sequence length; attention sdpa or flash.",
        default=1,
    )
    ep: int = doc(
        "Expert-parallel degree (backend fsdp2, mixtures of experts): each block's routed experts split over ep of "
        "the dp_shard ranks (ep consecutive ranks, each holding num_experts / ep whole experts), tokens sent to "
        "their experts' rank and back by all-to-all (transformers' expert-parallel styles: base_model_ep_plan); "
        "FSDP2 shards each expert over the dp_shard / ep ranks left. Must divide dp_shard and the experts.",
        default=1,
    )
    loss_chunk_tokens: int = doc(
        "Compute the LM head and the cross-entropy over chunks of this many tokens, each recomputed in backward, so "
        "the logits of a micro-batch never exist at once (with 128k-152k vocabularies they dominate long-sequence "
        "memory); costs one more LM-head forward. 0: all tokens at once.",
        default=0,
    )
    pp: int = doc(
        "Pipeline-parallel degree (backend fsdp2): the decoder layers cut into pp x pp_virtual_stages contiguous "
        "stages (first: embeddings; last: final norm, head and loss), each a copy of the HF model holding only its "
        "part under the original parameter names, with FSDP2 (and tp) inside each stage. Needs the model's "
        "base_model_pp_plan and an untied LM head. See recipes/pp_tp_fsdp.yaml.",
        default=1,
    )
    pp_schedule: PipelineSchedule = doc(
        "Pipeline schedule (torch.distributed.pipelining): 1f1b (needs at least pp micro-batches per step) or gpipe "
        "(one stage per rank); interleaved_1f1b or looped_bfs (pp_virtual_stages per rank). The zero-bubble "
        "schedules (interleaved_zero_bubble, zbv_zero_bubble, dual_pipe_v) are refused: with FSDP2 stages they did "
        "not train the same model as a single-process loop.",
        default="1f1b",
    )
    pp_virtual_stages: int = doc(
        "Pipeline stages per pp rank (multi-stage schedules); pp x pp_virtual_stages may not exceed the layers.",
        default=1,
    )
    activation_checkpointing: Checkpointing = doc(
        "Recompute activations of decoder blocks in backward: none; selective (per op: keep the matmuls' and "
        "attention's outputs, recompute the element-wise ops between them); full (keep only each block's input).",
        default="none",
    )
    checkpoint_every: int = doc(
        "Checkpoint only every k-th decoder block (0, k, 2k, ...) with activation_checkpointing; the others keep all "
        "their activations. 1: every block.",
        default=1,
    )
    offload_activations: bool = doc(
        "Move what each decoder block saves for backward to host memory during forward and back for its backward "
        "(pinned buffers and a side stream on CUDA, so the copies overlap compute; the next block back is fetched "
        "ahead). With activation_checkpointing full it moves the blocks' checkpointed inputs only (DeepSpeed ALST's "
        "offloaded checkpoints); not with selective. Costs host memory and PCIe time, both in bigtrain plan.",
        default=False,
    )
    micro_batch_size: int = doc("Sequences per forward pass on one data-parallel rank.", default=1)
    offload_optimizer: bool = doc(
        "Keep optimizer states in host memory and step them there (backend deepspeed: ZeRO-Offload; fsdp2 offloads "
        "them with offload_params).",
        default=False,
    )
    offload_params: bool = doc(
        "Keep sharded parameters in host memory (fsdp2: CPUOffloadPolicy on CUDA, with their gradients and the AdamW "
        "step; no effect on a CPU; deepspeed: ZeRO-3 offload_param).",
        default=False,
    )
    hardware_profile: str | None = doc(
        "plan: auto: a profile written by bigtrain probe (JSON); its measured matmul rates and link bandwidth replace "
        "the GPU table's in the time model that ranks the plans.",
        default=None,
    )
    deepspeed_config: str | None = doc(
        "backend deepspeed: your own DeepSpeed JSON instead of the template from deepspeed_configs/ that the plan "
        'selects; its "auto" values are filled from the recipe and the plan, and a value that contradicts them '
        "(batch, accumulation, clipping, precision, ZeRO stage, offload) is an error.",
        default=None,
    )
    # not a key of its own: the parallel keys capability records bring (capabilities/table.Option), which the
    # loader collects here from this section and writes back among the others
    options: dict[str, Any] = field(default_factory=dict, metadata={"record_options": True})


@dataclass
class AdapterConfig:
    """The ``lora`` section (peft's names): read when ``train.method`` is lora or qlora."""

    r: int = doc("Rank of each adapter (peft's r).", default=16)
    alpha: float = doc("Scaling numerator: the adapter's output is multiplied by alpha / r.", default=32.0)
    dropout: float = doc("Dropout on the adapter's input (peft's lora_dropout).", default=0.0)
    target_modules: list[str] | None = doc(
        "Names (the last part, e.g. q_proj) or regular expressions of the linear modules that get adapters; unset: "
        "every linear of the decoder blocks (not the LM head).",
        default=None,
    )
    modules_to_save: list[str] | None = doc(
        "Modules trained fully beside the adapters (peft's modules_to_save), by the last part of their name, e.g. "
        "[embed_tokens, lm_head] for new tokens: their weights stay fp32 and get gradients and AdamW, and the "
        "adapter file carries them. A tied embedding trains once, for both its uses.",
        default=None,
    )


@dataclass
class CheckpointConfig:
    every: int | Literal["auto"] = doc(
        "Save a checkpoint every this many optimizer steps; 0 saves only at the end (and on SIGTERM); auto: "
        "Young/Daly's sqrt(2 x save time x MTBF), the save timed by a first checkpoint 10 steps in.",
        default=500,
    )
    mtbf_hours: float | None = doc("every: auto: the job's MTBF in hours (unset: gpu_mtbf_hours / GPUs).", default=None)
    gpu_mtbf_hours: float = doc(
        "every: auto: one GPU's MTBF in hours (Llama 3's report: one failure per ~50,700 GPU-hours).", default=50000.0
    )
    keep: int = doc("Keep the newest this many complete checkpoints; older ones are deleted.", default=3)
    resume: bool | str = doc(
        "auto: continue from the newest complete checkpoint in output_dir/checkpoints (or start fresh if there is "
        "none); a path: continue from that checkpoint; false: start from step 0 (an earlier run's outputs in "
        "output_dir are moved aside, not deleted).",
        default="auto",
    )
    async_save: bool = doc(
        "Write checkpoints in a background thread after copying the state to host memory, instead of stalling "
        "training for the write (costs one extra host copy of this rank's state).",
        key="async",
        default=False,
    )
    save_final_model: bool = doc(
        "At the end of the run, also write the model as a HuggingFace folder in output_dir/model.", default=True
    )


@dataclass
class RecipeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    lora: AdapterConfig = field(default_factory=AdapterConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    output_dir: str = doc(
        "Where the run writes: metrics.jsonl, plan.json, recipe.yaml, checkpoints/step_N/, and model/ (HF folder).",
        default="outputs/run",
    )
