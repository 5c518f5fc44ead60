"""The parts of a vision-language model, by the family's own module names: its vision tower, the projector that maps
image features into the language model's width, and the language model (with its LM head).

Families name them differently (Qwen2.5-VL: ``model.visual`` holding ``merger``; Idefics3: ``model.vision_model``,
``model.connector``, ``model.text_model``; LLaVA and Gemma 3: ``model.vision_tower``, ``model.multi_modal_projector``,
``model.language_model``). Each parameter belongs to exactly one part: the projector's, else the vision tower's, else
the language model's (embeddings and LM head included), so freezing the vision tower of Qwen2.5-VL leaves its merger
trainable.
"""

from __future__ import annotations

from typing import Any

from bigtrain.errors import ConfigError

PARTS = ("vision_tower", "projector", "language_model")
# the module names transformers' families give each part (the last component of the module's qualified name)
_NAMES = {
    "vision_tower": ("vision_tower", "visual", "vision_model", "vision_encoder"),
    "projector": ("multi_modal_projector", "connector", "merger", "mm_projector"),
    "language_model": ("language_model", "text_model"),
}


def part_modules(model: Any) -> dict[str, str]:
    """The qualified name of each part's module in ``model`` (the shallowest of the family's names)."""
    found: dict[str, str] = {}
    for name, _ in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        for part, names in _NAMES.items():
            if last in names and (part not in found or name.count(".") < found[part].count(".")):
                found[part] = name
    missing = [p for p in PARTS if p not in found]
    if missing:
        raise ConfigError(
            f"{type(model).__name__}: cannot find its {' and '.join(missing)} (modules named "
            f"{', '.join(n for p in missing for n in _NAMES[p])}); name the modules to freeze by their own names"
        )
    return found


def has_parts(hf_config: Any) -> bool:
    """Whether the model has parts of its own (``PARTS``): a vision tower beside a language model."""
    return getattr(hf_config, "vision_config", None) is not None


def language_config(hf_config: Any) -> Any:
    """The config of what a model's rows go through: a vision-language model's text config (its language model's
    heads, layers, vocabulary and tp layout); any other model's config as it is."""
    if not has_parts(hf_config):
        return hf_config
    return hf_config.get_text_config()


def part_module(model: Any, part: str) -> Any:
    """The module of one part (``PARTS``) of ``model``."""
    return model.get_submodule(part_modules(model)[part])


def part_of(parameter: str, parts: dict[str, str]) -> str:
    """Which part a parameter (by its qualified name) belongs to."""
    for part in ("projector", "vision_tower"):
        if parameter.startswith(parts[part] + "."):
            return part
    return "language_model"


def frozen_parameters(model: Any, freeze: list[str]) -> list[str]:
    """The names of the parameters ``model.freeze`` names: a part (``PARTS``), or a module of the model by its own
    qualified name (e.g. ``model.visual.blocks.0``). A name that is neither is one line listing what is."""
    modules = {name for name, _ in model.named_modules() if name}
    out: list[str] = []
    for entry in freeze:
        if entry in modules:  # a module's own name (any model's: a text model has no vision-language parts)
            hits = [n for n, _ in model.named_parameters() if n.startswith(entry + ".")]
        elif entry in PARTS:
            parts = part_modules(model)
            hits = [n for n, _ in model.named_parameters() if part_of(n, parts) == entry]
        else:
            parts = part_modules(model)
            named = ", ".join(f"{p} ({parts[p]})" for p in PARTS)
            children = ", ".join(n for n in sorted(modules) if n.count(".") <= 1)
            raise ConfigError(
                f"model.freeze: {entry!r} is not a part of {type(model).__name__}; its parts are {named}, and its "
                f"modules include {children}"
            )
        out += [n for n in hits if n not in out]
    return out


def language_model_block_linears(model: Any) -> list[str]:
    """The last name part of every linear inside the language model's repeated blocks."""
    from bigtrain.config.hf import decoder_blocks, is_linear

    prefix = part_modules(model)["language_model"] + "."
    where = {id(block): name for name, block in model.named_modules()}
    names: set[str] = set()
    for _, _, block in decoder_blocks(model):
        if where[id(block)].startswith(prefix):
            names |= {n.rsplit(".", 1)[-1] for n, m in block.named_modules() if is_linear(m)}
    return sorted(names)


def language_model_linears(model: Any, names: list[str]) -> str:
    """peft's ``target_modules`` as a regular expression (peft matches it against each module's whole name): the
    linears called ``names`` inside the language model, not the vision tower's of the same names."""
    prefix = part_modules(model)["language_model"].replace(".", r"\.")
    return rf"{prefix}\..*\.({'|'.join(sorted(names))})"
