"""A LoRA/QLoRA checkpoint as peft's adapter folder, or merged into its base as a HuggingFace model folder.

A checkpoint of an adapter run holds only the adapters and the modules of ``lora.modules_to_save`` (and their
optimizer state); the base is named by the recipe
it carries (``model.name_or_path``) and pinned by a fingerprint (``base_model.py``). Both outputs are written by one
CPU process from the checkpoint's DCP files, which assemble each adapter whole from the pieces every rank wrote:
- ``export_adapter``: ``adapter_config.json`` + ``adapter_model.safetensors`` with peft's keys
  (``base_model.model.<name>.lora_A.weight``; a module trained fully as ``base_model.model.<name>.weight``, the
  key peft's modules_to_save wrapper saves), loadable by ``PeftModel.from_pretrained``;
- ``export_merged``: the base with ``W + (alpha / r) B A`` written into each adapted weight, in the base's dtype,
  one base tensor at a time, and each module trained fully replaced by its trained value. Under QLoRA the adapters
  were trained against the NF4-dequantised base, so that is the ``W`` they are added to (the note says so).
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from bigtrain.checkpoint.base_model import check_base
from bigtrain.checkpoint.layout import HF_FILES, RECIPE, Manifest, check_files, resolve_checkpoint, staged
from bigtrain.checkpoint.reader import MODEL_PREFIX, load_into, read_metadata
from bigtrain.config.diffusers_config import WEIGHTS_STEM, quiet_pipeline
from bigtrain.config.hf import causal_lm_class, model_class
from bigtrain.config.load import load_recipe
from bigtrain.config.model_parts import has_parts
from bigtrain.config.schema import ADAPTER_METHODS, RecipeConfig
from bigtrain.errors import ConfigError

log = logging.getLogger("bigtrain")
ADAPTER_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # how peft keys an adapter of a causal LM in its file
# an adapter names its base by folder: a model built from model.config has none on disk
NO_BASE = (
    "it has no base folder an adapter could name (its values were drawn from train.seed); train from a saved folder "
    "(model.name_or_path), or export the whole model of a train.method=full run"
)


def adapter_recipe(folder: Path) -> RecipeConfig | None:
    """The recipe of a checkpoint when it trained adapters, else None."""
    cfg = load_recipe(folder / RECIPE)
    return cfg if cfg.train.method in ADAPTER_METHODS else None


def trained_fully(name: str, cfg: RecipeConfig) -> bool:
    """Whether tensor ``name`` belongs to a module of ``lora.modules_to_save`` (peft's rule: the module's name ends
    with the entry)."""
    modules = [name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)]
    return any(m.endswith(entry) for m in modules for entry in cfg.lora.modules_to_save or ())


def read_adapters(folder: Path, cfg: RecipeConfig) -> dict[str, torch.Tensor]:
    """Every trained tensor of checkpoint ``folder``, whole, by name: the adapters (``….q_proj.lora_A.weight``)
    and the modules trained fully (``model.embed_tokens.weight``)."""
    metadata = read_metadata(folder)
    names = [
        key.removeprefix(MODEL_PREFIX)
        for key in metadata.state_dict_metadata
        if key.startswith(MODEL_PREFIX) and (".lora_" in key or trained_fully(key.removeprefix(MODEL_PREFIX), cfg))
    ]
    if not any(".lora_" in name for name in names):
        raise ConfigError(f"checkpoint {folder} holds no LoRA adapters")
    state = {}
    for name in names:
        md = metadata.state_dict_metadata[MODEL_PREFIX + name]
        state[MODEL_PREFIX + name] = torch.empty(md.size, dtype=md.properties.dtype)
    with warnings.catch_warnings():  # DCP warns that it reads in one process: that is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load_into(state, folder, no_dist=True)
    return {name.removeprefix(MODEL_PREFIX): value for name, value in state.items()}


def _targets(cfg: RecipeConfig, adapters: dict[str, torch.Tensor], hf_config: Any) -> list[str] | str:
    """What peft injects on load: the recipe's targets, or what training adapted by default (the adapted modules'
    last names; a vision-language model's language model alone, whose linear names its vision tower shares)."""
    if cfg.lora.target_modules is not None:
        return list(cfg.lora.target_modules)
    if has_parts(hf_config):  # a vision-language model: its language model's linears, not its tower's
        from bigtrain.models.build import build_meta_model
        from bigtrain.parallel.transforms.adapters import target_modules

        return target_modules(build_meta_model(hf_config, "eager"), cfg.lora)
    return sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in adapters if ".lora_" in name})


def _aliases(folder: Path) -> dict[str, list[str]]:
    """Each parameter name of the checkpoint's model to the other names of the same tensor (a tied LM head and
    embedding), from the model built on meta."""
    from transformers import AutoConfig

    from bigtrain.models.build import build_meta_model

    model = build_meta_model(AutoConfig.from_pretrained(folder / HF_FILES), "eager")
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return {name: [n for n in group if n != name] for group in names.values() for name in group}


def export_adapter(checkpoint: str | Path, out: str | Path, task_type: str | None = "CAUSAL_LM") -> Path:
    """Write an adapter checkpoint as peft's folder ``out`` (replaced atomically); returns the checkpoint used.
    ``task_type``: peft's task type of the model's task (``TaskSpec.peft_task_type``: what ``PeftModel`` wraps it
    as; None for a task peft has none for)."""
    from safetensors.torch import save_file

    from bigtrain.parallel.transforms.adapters import peft_config

    folder = resolve_checkpoint(checkpoint)
    manifest = Manifest.read(folder)
    check_files(folder, manifest)
    cfg = adapter_recipe(folder)
    if cfg is None:
        raise ConfigError(f"checkpoint {folder} trained the whole model (train.method=full): it has no adapter")
    if cfg.model.name_or_path is None:
        raise ConfigError(f"checkpoint {folder} adapted a model built from model.config: {NO_BASE}")
    adapters = read_adapters(folder, cfg)
    with staged(Path(out)) as partial:
        partial.mkdir(parents=True)
        # a module trained fully whose weight is tied: peft keeps it tied on load when asked, and then reads the
        # trained value under each of the tensor's names (as its own save writes it)
        aliases = _aliases(folder) if cfg.lora.modules_to_save else {}
        tied = {alias: value.clone() for name, value in adapters.items() for alias in aliases.get(name, [])}
        hf_config = _hf_config(folder)
        targets = _targets(cfg, adapters, hf_config)
        config = peft_config(cfg.lora, targets, tied=bool(tied), task_type=task_type)
        if getattr(hf_config, "weights_stem", None) == WEIGHTS_STEM:  # a diffusion transformer: diffusers' format
            _write_diffusers_lora(partial, adapters, config, hf_config.class_name)
            return folder
        # the base by the absolute path the run recorded: AutoPeftModelForCausalLM.from_pretrained(this folder)
        # then finds it from any directory, never asking the hub for a relative name
        recorded = (manifest.base or {}).get("path")
        config.base_model_name_or_path = recorded or str(Path(cfg.model.name_or_path).resolve())
        config.save_pretrained(str(partial))
        for file in (folder / HF_FILES).iterdir():  # the run's tokenizer (and chat template) beside the adapter
            if file.is_file() and file.name not in ("config.json", "generation_config.json"):
                shutil.copy2(file, partial / file.name)
            elif file.is_dir():  # an embedding model's pooling settings (sentence-transformers' 1_Pooling)
                shutil.copytree(file, partial / file.name)
        tensors = {PEFT_PREFIX + name: value.contiguous() for name, value in {**tied, **adapters}.items()}
        save_file(tensors, str(partial / ADAPTER_FILE), metadata={"format": "pt"})
    return folder


def _publish_merged_by_transformers(folder: Path, base: Path, out: Path, task_type: str | None) -> None:
    """The base loaded by transformers (its key renaming: a classifier or a vision-language model saved under an
    older transformers' names; a classifier's head made for the data's labels), the exported adapter applied and
    merged by peft (``merge_and_unload``), saved with the run's processor files."""
    import tempfile

    from peft import PeftModel
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    config = AutoConfig.from_pretrained(folder / HF_FILES)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its report of the replaced head: the run said so when it started
    hf_logging.disable_progress_bar()  # one line says what was written
    try:
        model = model_class(config).from_pretrained(base, config=config, ignore_mismatched_sizes=True)
        with staged(out) as partial:
            with tempfile.TemporaryDirectory() as scratch:
                export_adapter(folder, Path(scratch) / "adapter", task_type)
                merged = PeftModel.from_pretrained(model, Path(scratch) / "adapter").merge_and_unload()
            merged.save_pretrained(partial)
            for file in (folder / HF_FILES).iterdir():  # the image processor or tokenizer the run saved
                if file.is_file() and not (partial / file.name).exists():
                    shutil.copy2(file, partial / file.name)
    finally:  # also when loading or merging fails
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


def _hf_config(folder: Path) -> Any:
    """The checkpoint's model config (its task names what peft wraps and how the base loads)."""
    from bigtrain.models.build import read_saved_config

    return read_saved_config(folder / HF_FILES)


# the pipeline whose LoRA saver writes a transformer class's adapters
LORA_PIPELINES = {"FluxTransformer2DModel": "FluxPipeline", "SD3Transformer2DModel": "StableDiffusion3Pipeline"}


def _write_diffusers_lora(partial: Path, adapters: dict[str, torch.Tensor], config: Any, class_name: str) -> None:
    """A diffusion transformer's adapters as its pipeline saves a LoRA (``pytorch_lora_weights.safetensors``, keyed
    ``transformer.…``, its peft config as ``lora_adapter_metadata``), which ``pipeline.load_lora_weights`` reads."""
    with quiet_pipeline():  # the pipeline's module imports image processors that note their fallback to PIL
        import diffusers

        pipeline = getattr(diffusers, LORA_PIPELINES[class_name])
    metadata = json.loads(json.dumps(config.to_dict(), default=sorted))  # peft's sets as lists
    # the modules adapted, by their full names: the trained config's may hold peft's shortened endings ("0" for
    # "to_out.0"), which the loader would match against every block numbered 0 and warn about
    metadata["target_modules"] = sorted({name.split(".lora_")[0] for name in adapters})
    layers = {name: value.contiguous() for name, value in adapters.items()}
    pipeline.save_lora_weights(
        str(partial), transformer_lora_layers=layers, transformer_lora_adapter_metadata=metadata
    )


def export_merged(checkpoint: str | Path, out: str | Path, task_type: str | None = "CAUSAL_LM") -> Path:
    """Write base + adapters of an adapter checkpoint as a HF folder ``out`` in the base's dtype (``task_type`` as
    ``export_adapter``'s)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder = resolve_checkpoint(checkpoint)
    manifest = Manifest.read(folder)
    check_files(folder, manifest)
    cfg = adapter_recipe(folder)
    if cfg is None:
        raise ConfigError(f"checkpoint {folder} trained the whole model: export it without --merge")
    if cfg.model.name_or_path is None:
        raise ConfigError(f"checkpoint {folder} adapted a model built from model.config: {NO_BASE}")
    base = Path(cfg.model.name_or_path)
    check_base(base, manifest.base, f"bigtrain export-model {folder} --merge")
    # a classifier, a vision-language model: its base may name weights as an older transformers did
    hf_config = _hf_config(folder)
    if model_class(hf_config) is not causal_lm_class(hf_config):
        _publish_merged_by_transformers(folder, base, Path(out), task_type)
        return folder
    adapters = read_adapters(folder, cfg)
    scale = cfg.lora.alpha / cfg.lora.r
    files = sorted(p.name for p in base.glob("*.safetensors"))
    merged = 0
    with staged(Path(out)) as partial:
        shutil.copytree(folder / HF_FILES, partial)
        for file in files:
            tensors = {}
            with safe_open(str(base / file), framework="pt", device="cpu") as handle:
                for key in handle.keys():
                    value = handle.get_tensor(key)
                    stem = key.removesuffix(".weight")
                    if f"{stem}.lora_A.weight" in adapters:
                        value = _merge(value, adapters, stem, scale, cfg.train.method == "qlora")
                        merged += 1
                    elif key in adapters:  # a module trained fully: its trained value, in the base's dtype
                        value = adapters[key].to(value.dtype)
                    tensors[key] = value
            save_file(tensors, str(partial / file), metadata={"format": "pt"})
        if (base / "model.safetensors.index.json").is_file():
            shutil.copy2(base / "model.safetensors.index.json", partial / "model.safetensors.index.json")
        _keep_base_dtype(partial / "config.json", base / "config.json")
        pairs = sum(".lora_A." in name for name in adapters)
        if merged != pairs:  # raised inside: nothing is published
            raise ConfigError(f"{base} has {merged} of the {pairs} weights the adapters adapt")
    if cfg.train.method == "qlora":
        log.info("note: the adapters were trained on the NF4 base; merged into its dequantised values")
    return folder


@torch.no_grad()
def _merge(weight: torch.Tensor, adapters: dict[str, torch.Tensor], stem: str, scale: float, nf4: bool) -> torch.Tensor:
    from bigtrain.parallel.transforms.adapters import dequantized_as_trained

    base = dequantized_as_trained(weight) if nf4 else weight.float()
    delta = adapters[f"{stem}.lora_B.weight"].float() @ adapters[f"{stem}.lora_A.weight"].float()
    if delta.shape != base.shape:  # GPT-2's Conv1D stores its weight as (in, out)
        delta = delta.T
    return (base + scale * delta).to(weight.dtype)


def _keep_base_dtype(config_path: Path, base_config: Path) -> None:
    """The merged folder says the base's dtype (the checkpoint's hf/config.json says fp32, the trained dtype)."""
    config = json.loads(config_path.read_text())
    base = json.loads(base_config.read_text())
    for key in ("dtype", "torch_dtype"):
        if key in base:
            config[key] = base[key]
        else:
            config.pop(key, None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
