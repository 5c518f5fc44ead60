"""``model.task: image-text-to-text``: a vision-language chat model trained on conversations whose user turns hold
images (the processor expands each image into the family's image tokens; the loss is on the assistant's tokens).

Data-parallel plans, LoRA on the language model, parts frozen by name (``model.freeze``) and tensor parallelism of the
language model (its text config's layout; the tower whole on every tp rank). What else splits a decoder's blocks,
sequence or vocabulary (pp, cp, ep, sequence parallelism, the chunked and vocabulary-parallel losses) is not built:
the image features join the language model inside the model's own forward, which the splits do not see. FP8,
activation offload and compile are not tried on these models yet, and the preference objectives are not built for
them (``built_objectives``).
"""

from __future__ import annotations

from typing import Any

from bigtrain.config.capabilities.table import first_unbuilt, row, split_settings
from bigtrain.config.schema import RecipeConfig
from bigtrain.config.setup import Setup
from bigtrain.errors import ConfigError
from bigtrain.tasks import token_rows
from bigtrain.tasks.spec import TOKEN_ROWS, TaskSpec

NAME = "image-text-to-text"


def read_chats(cfg: RecipeConfig, hf_config: Any) -> tuple[Any, Any]:
    """Conversations with images through the model's processor (``data.processor``, else the model's folder), and
    the held-out ones."""
    from bigtrain.data.held_out import with_held_out
    from bigtrain.data.image_chat_cache import load_image_chats
    from bigtrain.data.processor import load_processor

    data_cfg = cfg.data
    folder = data_cfg.processor or cfg.model.name_or_path
    if folder is None:
        raise ConfigError(
            "model.task=image-text-to-text reads its data through the model's processor: set data.processor to its "
            "folder (model.config builds no processor)"
        )
    key = "data.processor" if data_cfg.processor else "model.name_or_path"
    processor = load_processor(folder, key, data_cfg.min_pixels, data_cfg.max_pixels)
    vocab = hf_config.get_text_config().vocab_size
    if len(processor.tokenizer) > vocab:
        raise ConfigError(
            f"{key}={folder!r}: the processor's tokenizer has {len(processor.tokenizer)} ids but the language "
            f"model's vocab_size is {vocab}; use the model's own processor"
        )
    data = load_image_chats(data_cfg, "data.path", data_cfg.path, processor, cfg.train.seed)

    def read_held_out(key: str, path: str) -> Any:
        return load_image_chats(data_cfg, key, path, processor, cfg.train.seed + 1)

    return with_held_out(cfg, data, read_held_out, "conversations")


def check(cfg: RecipeConfig, hf_config: Any, data: Any, attention: str, is_main: bool) -> list[str]:
    """The token-row checks, and a note on images the processor resizes into its pixel budget."""
    from bigtrain.data.processor import pixel_budget

    notes = token_rows.check_rows(cfg, hf_config, data, attention, is_main, NAME)
    if data.resized:
        low, high = pixel_budget(data.processor.image_processor) or (0, 0)
        notes.append(
            f"data.path: {data.resized} images are outside the pixel budget (data.min_pixels={low}, "
            f"data.max_pixels={high}): the processor resizes them into it"
        )
    return notes


def workload(base: Any, data: Any, cfg: RecipeConfig) -> Any:
    """The images a row holds and their mean size as the processor sizes them, and the frozen parts."""
    import dataclasses

    return dataclasses.replace(
        base, image_size=data.image_side, images_per_row=data.images_per_row, frozen=tuple(cfg.model.freeze)
    )


def files(cfg: RecipeConfig, hf_config: Any, data: Any) -> Any:
    """The processor (tokenizer, chat template, image processor with the run's pixel budget) beside the weights."""
    from bigtrain.checkpoint.export import HfFiles

    folder = cfg.data.processor or cfg.model.name_or_path
    return HfFiles(processor=(folder, cfg.data.min_pixels, cfg.data.max_pixels) if folder else None)


def synthetic(hf_config: Any, plan: Any, workload: Any, device: Any) -> Any:
    from bigtrain.tasks.image_chat_inputs import image_chat_batch

    return image_chat_batch(hf_config, plan, workload, device)


def count(batch: Any, workload: Any, plan: Any) -> float:
    """The labelled tokens of the global batch: as many per micro-batch as the synthetic one holds."""
    from bigtrain.data.labels import IGNORE_INDEX

    labelled = int((batch.labels != IGNORE_INDEX).sum())
    return float(labelled * workload.global_batch_size // plan.micro_batch_size)


def real_inputs() -> Any:
    """On fake tensors, what derives from the batch's token ids and image grids stays real (the forward reads it)."""
    from bigtrain.tasks.image_chat_inputs import RealValuedInputs

    return RealValuedInputs()


# what a GPU's step said of the time model for these models, until the model is corrected (GPU.md, item 3)
UNCHECKED_TIME = (
    "* step times of vision-language models are not checked yet: on an H200 one measured step of Qwen2.5-VL-3B with "
    "LoRA took 7.2x the predicted time (bench/results/vlm_lora_h200.md; its memory was within 4.6%)"
)


def planner(model_config: dict[str, Any], workload: Any) -> Any:
    """The language model's statistics and its tower's (``planner/vision_stats.py``), with the note that its step
    times are not checked yet."""
    import dataclasses

    from bigtrain.planner.planned import lm_model

    return dataclasses.replace(lm_model(model_config), time_note=UNCHECKED_TIME)


def vision_language_with_model_parallelism(s: Setup) -> str | None:
    for key, value, default in split_settings(s.plan):
        if value != default and key != "tp":  # tp slices the language model's blocks by its own layout
            return (
                f"parallel.{key}={str(value).lower()} with model.task={NAME} is not built yet (the image features "
                "join the language model inside the model's own forward); train it with data parallelism: backend "
                f"ddp, fsdp2 or deepspeed, parallel.{key}={str(default).lower()}"
            )
    return None


def vision_language_with_untested_options(s: Setup) -> str | None:
    p, t = s.plan, s.train
    return first_unbuilt(
        NAME,
        (
            ("train.fp8", t.fp8, t.fp8 not in ("none", "auto"), "none"),
            ("train.compile", "true", t.compile is True, "false"),
            ("parallel.offload_activations", "true", p.offload_activations, "false"),
        ),
    )


TASK = TaskSpec(
    name=NAME,
    summary="vision-language chat models: conversations with images through the model's processor",
    auto_class="AutoModelForImageTextToText",
    # its classes end in ForConditionalGeneration, as seq2seq models' do: only transformers' mapping names them
    mapping="MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    suffix=None,
    unit="tokens",
    outputs=TOKEN_ROWS,
    default_objective="sft",
    built_objectives=("sft",),
    auto=True,
    claims=lambda hf_config: getattr(hf_config, "vision_config", None) is not None,
    read_data=read_chats,
    check=check,
    workload=workload,
    planner=planner,
    sizes=token_rows.sizes,
    synthetic=synthetic,
    count=count,
    real_inputs=real_inputs,
    export_files=files,
    peft_task_type="CAUSAL_LM",  # peft wraps a vision-language model as a causal LM (its generate)
    metrics=("eval_perplexity",),
    keys=("model.freeze", "data.processor", "data.min_pixels", "data.max_pixels", "data.image_field"),
    rules=(
        row(vision_language_with_model_parallelism, "not_built", reads_job=True),
        row(vision_language_with_untested_options, "not_built", reads_job=True),
    ),
    example={  # a tiny LLaVA (its config as recipes/make_vlm_demo.py builds it)
        "model_type": "llava",
        "text_config": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "vocab_size": 300},
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "num_hidden_layers": 2,
                          "num_attention_heads": 2},
    },  # fmt: skip
)
