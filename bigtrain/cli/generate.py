"""``bigtrain generate OUTPUT_DIR|MODEL_DIR [--prompt TEXT] [--chat] [--image PATH ...]``: try a trained model without
writing Python (a text-to-image model draws a picture instead: ``generate_image.py``).

The folder is a run's ``output_dir`` (its ``model/``, else its ``adapter/``), an HF model folder or a peft adapter
folder. The model and the tokenizer are the folder's own (a run's folder carries the tokenizer it trained with: the
recipe's, or the built-in byte tokenizer as an HF tokenizer), loaded by transformers (peft for an adapter, on the base
its config names). ``--chat`` renders the prompt with the tokenizer's chat template as one user turn; without
``--prompt`` it reads prompts from stdin, one per line, until end of input, and ends each answer with a line ``---``.
Greedy decoding unless ``--sample``. A vision-language model (its config's task) answers about ``--image`` files: one
user turn of the images then the prompt, through the processor saved with the model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bigtrain.cli.generate_image import add_image_arguments, is_text_to_image, run_image_command
from bigtrain.errors import ConfigError


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="a run's output_dir, an HF model folder, or a peft adapter folder")
    parser.add_argument("--prompt", help="the text to continue (or, with --chat, the user's message)")
    parser.add_argument("--chat", action="store_true", help="render the prompt with the tokenizer's chat template")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    parser.add_argument("--sample", action="store_true", help="sample (temperature 1) instead of greedy decoding")
    parser.add_argument(
        "--image", action="append", default=[], help="an image file the prompt asks about (vision-language models)"
    )
    add_image_arguments(parser)


def model_folder(path: str | Path) -> tuple[Path, bool]:
    """(the folder to load, whether it is a peft adapter) for a run's output_dir or a model or adapter folder."""
    folder = Path(path)
    for candidate in (folder / "model", folder / "adapter", folder):
        if (candidate / "adapter_config.json").is_file():
            return candidate, True
        if (candidate / "config.json").is_file():
            return candidate, False
    raise ConfigError(
        f"{folder} holds no model: give a run's output_dir (with model/ or adapter/, written at the end of a run), an "
        "HF model folder or a peft adapter folder; a checkpoint becomes one with bigtrain export-model"
    )


def load(folder: Path, adapter: bool) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" would land between the prompt and the answer

    if not any(folder.glob("tokenizer*")):
        raise ConfigError(
            f"{folder} has no tokenizer: it was trained on token rows (.npy); generate with the tokenizer that made "
            "them, in Python"
        )
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if adapter:
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(folder, local_files_only=True)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    return model.eval(), tokenizer


def generate(model: Any, tokenizer: Any, prompt: str, chat: bool, max_new_tokens: int, sample: bool) -> str:
    import torch

    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("--chat: the model's tokenizer has no chat template; drop --chat to continue plain text")
        inputs = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    else:
        inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=sample, pad_token_id=tokenizer.pad_token_id
        )
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def _adapter_base(folder: Path) -> str:
    """The base model folder a peft adapter folder names."""
    import json

    return json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]


def _vision_language(folder: Path, adapter: bool) -> bool:
    from transformers import AutoConfig

    from bigtrain.config.model_parts import has_parts

    config_folder = _adapter_base(folder) if adapter else folder
    return has_parts(AutoConfig.from_pretrained(config_folder, local_files_only=True))


def answer_about_images(folder: Path, adapter: bool, prompt: str, images: list[str], max_new_tokens: int) -> str:
    """A vision-language model's answer to one user turn of ``images`` and ``prompt``, greedy."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText
    from transformers.utils import logging as hf_logging

    from bigtrain.data.processor import load_processor

    hf_logging.disable_progress_bar()
    for image in images:
        if not Path(image).is_file():
            raise ConfigError(f"--image {image!r} does not exist")
    processor = load_processor(str(folder), "the model's folder")
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(_adapter_base(folder)), folder)
    else:
        model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True)
    content = [*({"type": "image"} for _ in images), {"type": "text", "text": prompt}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    pictures = [Image.open(image).convert("RGB") for image in images]
    inputs = processor(text=[text], images=[pictures] if pictures else None, return_tensors="pt")
    with torch.no_grad():
        out = model.eval().generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def run_generate_command(args: argparse.Namespace) -> int:
    if is_text_to_image(args.folder):
        return run_image_command(args)
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens={args.max_new_tokens} must be at least 1")
    folder, adapter = model_folder(args.folder)
    if _vision_language(folder, adapter):
        if args.prompt is None:
            raise ConfigError("a vision-language model answers one --prompt about its --image files: give --prompt")
        print(answer_about_images(folder, adapter, args.prompt, args.image, args.max_new_tokens), flush=True)
        return 0
    if args.image:
        raise ConfigError(f"--image: {folder} is not a vision-language model (it reads text only); drop --image")
    model, tokenizer = load(folder, adapter)
    if args.prompt is not None:
        print(generate(model, tokenizer, args.prompt, args.chat, args.max_new_tokens, args.sample), flush=True)
        return 0
    for line in sys.stdin:  # an answer may span lines: each ends with a line of its own, "---"
        print(generate(model, tokenizer, line.rstrip("\n"), args.chat, args.max_new_tokens, args.sample), flush=True)
        print("---", flush=True)
    return 0
