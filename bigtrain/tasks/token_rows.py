"""What the tasks that train on token rows share (causal-lm, image-text-to-text): their checks of the model against
the rows, what their exported folders hold beside the weights, and a synthetic micro-batch of rows."""

from __future__ import annotations

from typing import Any

from bigtrain.config.schema import ADAPTER_METHODS, RecipeConfig
from bigtrain.errors import ConfigError


def check_rows(cfg: RecipeConfig, hf_config: Any, data: Any, attention: str, is_main: bool, task: str) -> list[str]:
    """A token-row model's checks against its recipe and rows, before any process group: one block on meta (a bad
    attn_implementation fails here, and it shows the position embedding), the lora section's module names and
    model.freeze's against the model, the row length against the language model's positions; the note on packed
    documents (whether this family keeps them apart), if any."""
    from bigtrain.config.hf import one_block
    from bigtrain.config.model_parts import frozen_parameters, has_parts, language_config, part_module
    from bigtrain.models.build import build_meta_model
    from bigtrain.models.checks import check_sequence_length
    from bigtrain.parallel.transforms.adapters import modules_trained_fully, target_modules

    probe = build_meta_model(one_block(hf_config), cfg.model.attn_implementation)
    if cfg.train.method in ADAPTER_METHODS:
        # lora.target_modules or modules_to_save naming nothing that works: one line, before any group
        modules_trained_fully(probe, cfg.lora, target_modules(probe, cfg.lora))
    parts = has_parts(hf_config)
    if cfg.model.freeze and not parts:
        raise ConfigError(
            f"model.freeze={cfg.model.freeze} names parts of a vision-language model (model.task: "
            f"image-text-to-text); this model is a {task}: leave model.freeze empty"
        )
    if cfg.model.freeze:
        frozen_parameters(probe, cfg.model.freeze)  # a name the model lacks: one line listing what it has
    # the rows are the language model's (a vision tower has positions of its own)
    positions = part_module(probe, "language_model") if parts else probe
    check_sequence_length(language_config(hf_config), positions, data.seq_len, is_main=is_main)
    return [note for note in [packing_note(hf_config, data, attention)] if note]


def packing_note(hf_config: Any, data: Any, attention: str) -> str | None:
    """Packed documents (``data.packing: documents``) are checked against the family's attention."""
    from bigtrain.models.checks import check_packed_attention

    return check_packed_attention(hf_config, attention) if packed(data) else None


def packed(data: Any) -> bool:
    """Whether rows hold packed documents (position ids restarting per document; a stream's rows are made later)."""
    return getattr(data, "packed_documents", False) or getattr(data, "positions", None) is not None


def text_files(cfg: RecipeConfig, hf_config: Any, data: Any) -> Any:
    """A text model's folder holds the recipe's tokenizer, or the built-in byte tokenizer it read its text with."""
    from bigtrain.checkpoint.export import HfFiles

    byte_tokenizer = cfg.data.tokenizer is None and not str(cfg.data.path).endswith(".npy")
    return HfFiles(tokenizer=cfg.data.tokenizer, byte_tokenizer=byte_tokenizer)


def synthetic_rows(hf_config: Any, plan: Any, workload: Any, device: Any) -> Any:
    """A micro-batch of random token rows of the workload's length, every position predicting the next."""
    import torch

    from bigtrain.data.batch import MicroBatch

    shape = (plan.micro_batch_size, workload.seq_len)
    return MicroBatch.of_ids(torch.randint(0, hf_config.vocab_size, shape, device=device))


def labelled_tokens(batch: Any, workload: Any, plan: Any) -> float:
    """A global batch of such rows counts every position but each row's last."""
    return float(workload.global_batch_size * (workload.seq_len - 1))


DEFAULT_TOKENS_PER_STEP = 2**20  # ~1M tokens per optimizer step when no batch is given


def sizes(ask: Any) -> dict[str, Any]:
    """A token-row task's step as the planner is asked it: the row length (the argument, the recipe's, else the
    model's positions up to 2048), checked against the model's positions as ``bigtrain train`` checks it; the global
    batch (the argument, the recipe's, else about 1M tokens, a preference pair being two rows); a vision-language
    model's images (``images``)."""
    cfg, spell = ask.recipe, ask.spell
    from bigtrain.config.resolve import recipe_seq_len

    seq_len = ask.seq_len or (cfg and recipe_seq_len(cfg)) or default_seq_len(ask.model_config)
    check_plan_seq_len(ask.model_config, seq_len, spell("seq_len"))
    if ask.global_batch_size:
        batch = ask.global_batch_size
    elif cfg is not None:
        batch = cfg.train.global_batch_size
    else:
        batch = max(1, DEFAULT_TOKENS_PER_STEP // seq_len // ask.rows_per_example // ask.gpus) * ask.gpus
    return {"seq_len": seq_len, "global_batch_size": batch, **images(ask, seq_len)}


def images(ask: Any, seq_len: int) -> dict[str, Any]:
    """A vision-language model's images (their size and how many a row holds) and its frozen parts (the recipe's
    model.freeze); refused for a language model."""
    from bigtrain.planner.model_stats import ModelStats

    spell, size, per_row = ask.spell, ask.image_size, ask.images_per_row
    vision = ModelStats.from_config(ask.model_config).vision if "vision_config" in ask.model_config else None
    if vision is None:
        for name, value in (("image_size", size), ("images_per_row", per_row)):
            if value is not None:
                raise ConfigError(
                    f"{spell(name)} is for image classifiers and vision-language models; this model is a causal LM"
                )
        return {}
    if size is not None and size < 28:
        raise ConfigError(f"{spell.value('image_size', size)} is too small; use at least 28 pixels (448 is typical)")
    if per_row is not None and not per_row > 0:
        raise ConfigError(f"{spell.value('images_per_row', per_row)} must be above 0")
    from bigtrain.planner.vision_stats import DEFAULT_IMAGE_SIZE

    per_row, side = per_row or 1.0, size or DEFAULT_IMAGE_SIZE
    tokens = vision.tokens(side) * per_row
    if tokens > seq_len:
        raise ConfigError(
            f"{per_row:g} image(s) of {side} px per row are {tokens:,.0f} image tokens, more than the row's {seq_len} "
            f"tokens; raise {spell('seq_len')}, or lower {spell('image_size')} or {spell('images_per_row')}"
        )
    frozen = tuple(ask.recipe.model.freeze) if ask.recipe is not None else ()
    return {"image_size": size or 0, "images_per_row": per_row, "frozen": frozen}


def check_plan_seq_len(model_config: dict[str, Any], seq_len: int, key: str = "--seq-len") -> None:
    """The sequence against the model's positions, by the rule ``bigtrain train`` applies (models/checks.py): beyond
    a learned position table (GPT-2) refused, beyond a rotary model's max_position_embeddings a warning."""
    model_config = text_config_of(model_config)
    limits = [model_config.get(k) for k in ("max_position_embeddings", "n_positions", "n_ctx")]
    if all(isinstance(n, int) for n in limits if n is not None) and seq_len <= min(
        (n for n in limits if n is not None), default=0
    ):
        return  # within every position limit the config states: nothing to refuse or warn (no model to build)
    from bigtrain.config.hf import hf_config_from_dict, one_block
    from bigtrain.models.build import build_meta_model
    from bigtrain.models.checks import check_sequence_length

    hf_config = hf_config_from_dict(dict(model_config))
    probe = build_meta_model(one_block(hf_config), "auto")
    check_sequence_length(hf_config, probe, seq_len, is_main=True, key=key)


def default_seq_len(model_config: dict[str, Any]) -> int:
    """The sequence length to plan for when none is given: the model's maximum, at most 2048."""
    model_config = text_config_of(model_config)
    max_len = model_config.get("max_position_embeddings") or model_config.get("n_positions") or 2048
    return min(2048, max_len)


def text_config_of(model_config: dict[str, Any]) -> dict[str, Any]:
    """A vision-language model's language model as a causal LM's dict (its rows are the language model's); any
    other model's dict as it is."""
    from bigtrain.planner.model_stats import language_model_dict

    text = model_config.get("text_config")
    if not isinstance(text, dict) or "vision_config" not in model_config:
        return model_config
    return language_model_dict(text)
