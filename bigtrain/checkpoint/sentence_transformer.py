"""The files that make an embedding model's HF folder a sentence-transformers model: its modules (the transformer,
then the pooling), the pooling's settings and the longest text, written in the format sentence-transformers 5 writes
(which 6 still reads, converting its keys), so that ``SentenceTransformer(folder)`` embeds as the run trained."""

from __future__ import annotations

import json
from pathlib import Path

POOLING_FLAGS = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "last_token": "pooling_mode_lasttoken",
}
EVERY_FLAG = (
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)


def write_sentence_transformer(folder: Path, pooling: str, width: int, max_seq_length: int) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}, indent=2))
    settings = {"model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
                "similarity_fn_name": "cosine"}  # fmt: skip
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings, indent=2))
    flags = {flag: flag == POOLING_FLAGS[pooling] for flag in EVERY_FLAG}
    (folder / "1_Pooling").mkdir(exist_ok=True)
    pooling_config = {"word_embedding_dimension": width, **flags, "include_prompt": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2))


# the modules of a sentence-transformers folder whose embedding bigtrain trains as it is (normalising does not change
# a cosine); any other (Dense, a Router) would be dropped by the folder bigtrain writes
KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")
MODES = {"cls": "cls", "mean": "mean", "lasttoken": "last_token"}


def folder_pooling(folder: Path) -> str | None:
    """The pooling a sentence-transformers model folder was trained with (``train.pooling: auto`` keeps it), or None
    for a folder that is no sentence-transformers model."""
    from bigtrain.errors import ConfigError

    listed = folder / "modules.json"
    if not listed.is_file():
        return None
    modules = json.loads(listed.read_text())
    other = [m["type"] for m in modules if m.get("type", "").rsplit(".", 1)[-1] not in KNOWN_MODULES]
    if other:
        raise ConfigError(
            f"model.name_or_path={str(folder)!r} is a sentence-transformers model with {', '.join(other)} after its "
            "transformer, which bigtrain does not train yet (it trains the transformer and its pooling); use a "
            "folder of a transformer and pooling only"
        )
    pooling = next((m for m in modules if m.get("type", "").endswith("Pooling")), None)
    if pooling is None:
        return None
    config = json.loads((folder / pooling["path"] / "config.json").read_text())
    mode = config.get("pooling_mode") or next(
        (name for name, flag in POOLING_FLAGS.items() if config.get(flag)), None
    )  # sentence-transformers 6 writes the mode, 5 a flag per mode
    mode = MODES.get(str(mode).replace("_token", "").replace("_tokens", ""), mode)
    if mode not in POOLING_FLAGS:
        raise ConfigError(
            f"model.name_or_path={str(folder)!r} pools by {mode!r}, which bigtrain does not train yet; set "
            f"train.pooling to one of {', '.join(POOLING_FLAGS)}"
        )
    return mode
