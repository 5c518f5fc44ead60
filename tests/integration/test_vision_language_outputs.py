"""A trained vision-language model comes back as folders transformers and peft load, with its processor.

A 2-rank FSDP2 job fine-tunes a tiny Qwen2.5-VL (its vision tower frozen) and a 2-rank job trains LoRA adapters on a
tiny LLaVA's language model; each writes its trained parameters from the live engine (``train_and_save.py``). The
final folder (``AutoModelForImageTextToText.from_pretrained``, or peft's ``PeftModel.from_pretrained`` on the base),
and ``bigtrain export-model`` of the checkpoint, must give the trained model's logits on a test conversation within
1e-5, read through the processor saved beside them.
"""

from __future__ import annotations

import sys

import pytest
import torch
from helpers import REPO, recipe_dict, run_cli, run_torchrun, write_recipe

sys.path.insert(0, str(REPO / "recipes"))
from make_vlm_demo import save_tiny_vlm  # noqa: E402

WORKER = REPO / "tests" / "distributed" / "train_and_save.py"
LOGITS_ATOL = 1e-5
SEQ_LEN = 256


def conversation_inputs(folder) -> dict[str, torch.Tensor]:
    """A test conversation with two images, through the processor saved in ``folder``."""
    import numpy as np
    from PIL import Image

    from bigtrain.data.processor import load_processor

    processor = load_processor(str(folder), "the saved folder")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)) for h, w in ((32, 24), (20, 32))]
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Which?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "The first."}]},
    ]
    text = processor.apply_chat_template(messages, tokenize=False)
    return dict(processor(text=[text], images=[images], return_tensors="pt"))


def logits(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**inputs).logits


def train(tmp_path, family: str, train: dict, freeze: list[str]):
    base = save_tiny_vlm(tmp_path / "base", family)
    out = tmp_path / "out"
    recipe = recipe_dict(
        out,
        "builtin:image_chat",
        base,
        data={"seq_len": SEQ_LEN},
        train={"steps": 4, "global_batch_size": 4, "lr": 1e-2, **train},
        parallel={"backend": "fsdp2", "micro_batch_size": 1},
        checkpoint={"every": 0},
    )
    recipe["model"]["freeze"] = freeze
    path = write_recipe(tmp_path / "recipe.yaml", recipe)
    proc = run_torchrun([str(WORKER), str(path), str(tmp_path / "trained.pt")], nproc=2, module=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base, out, torch.load(tmp_path / "trained.pt")


def test_fine_tuned_model_and_its_export_give_the_trained_logits(tmp_path):
    from transformers import AutoConfig, AutoModelForImageTextToText

    base, out, state = train(tmp_path, "qwen2_5_vl", {}, ["vision_tower"])
    trained = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(base), dtype=torch.float32)
    trained.load_state_dict(state)  # every parameter: the frozen tower is model state too
    inputs = conversation_inputs(out / "model")
    expected = logits(trained, inputs)
    assert not torch.allclose(expected, logits(AutoModelForImageTextToText.from_pretrained(base), inputs), atol=1e-3)

    proc = run_cli(["export-model", str(out / "checkpoints" / "step_4"), "-o", str(tmp_path / "exported")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    for folder in (out / "model", tmp_path / "exported"):
        assert (folder / "preprocessor_config.json").is_file() and (folder / "chat_template.jinja").is_file()
        loaded = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True)
        torch.testing.assert_close(logits(loaded, conversation_inputs(folder)), expected, rtol=0, atol=LOGITS_ATOL)


@pytest.mark.full
def test_adapter_loads_with_peft_and_gives_the_trained_logits(tmp_path):
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForImageTextToText

    from bigtrain.parallel.transforms.adapters import peft_config

    base, out, state = train(tmp_path, "llava", {"method": "lora"}, [])
    adapter = out / "adapter"
    loaded = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(base), adapter)
    inputs = conversation_inputs(adapter)
    # the trained model: the base with bigtrain's adapters written into peft's layers by their names
    import json

    targets = json.loads((adapter / "adapter_config.json").read_text())["target_modules"]
    assert isinstance(targets, str) and "language_model" in targets  # never the vision tower's q_proj/k_proj
    from bigtrain.config.schema import AdapterConfig

    trained = get_peft_model(AutoModelForImageTextToText.from_pretrained(base), peft_config(AdapterConfig(), targets))
    own = {n.removeprefix("base_model.model.").replace(".default", ""): p for n, p in trained.named_parameters()}
    assert {n for n in own if ".lora_" in n} == set(state)
    with torch.no_grad():
        for name, value in state.items():
            own[name].copy_(value)
    expected = logits(trained, inputs)
    torch.testing.assert_close(logits(loaded, inputs), expected, rtol=0, atol=LOGITS_ATOL)


@pytest.mark.full
def test_resume_on_another_plan_continues_exactly_and_keeps_the_frozen_tower(tmp_path):
    """6 steps straight on FSDP2, against 3 steps then a resume on DeepSpeed ZeRO-2 (the frozen tower read back from
    the checkpoint): the same losses and grad norms, the same final weights, the tower the starting folder's."""
    from helpers import read_metrics, run_cli
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    base = save_tiny_vlm(tmp_path / "base", "qwen2_5_vl")
    recipe = recipe_dict(
        tmp_path / "straight",
        "builtin:image_chat",
        base,
        data={"seq_len": 160},
        train={"steps": 6, "global_batch_size": 4, "lr": 1e-3, "lr_schedule": "constant"},
        parallel={"backend": "fsdp2", "micro_batch_size": 1},
        checkpoint={"every": 3},
    )
    recipe["model"]["freeze"] = ["vision_tower"]
    path = write_recipe(tmp_path / "recipe.yaml", recipe)
    resumed = f"output_dir={tmp_path / 'resumed'}"
    for extra in ([], ["--set", resumed, "--set", "train.steps=3"], ["--set", resumed, "--set",
                  "parallel.backend=deepspeed", "--set", "parallel.zero_stage=2"]):  # fmt: skip
        proc = run_cli(["train", str(path), "--nproc", "2", *extra], timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stderr
    straight, again = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert [m["step"] for m in again] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(straight, again, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6) and b["grad_norm"] == pytest.approx(
            a["grad_norm"], rel=1e-5
        )
    one, two = (load_file(str(tmp_path / run / "model" / "model.safetensors")) for run in ("straight", "resumed"))
    assert max((one[k] - two[k]).abs().max().item() for k in one) < 1e-6
    start = AutoModelForImageTextToText.from_pretrained(base).state_dict()
    final = AutoModelForImageTextToText.from_pretrained(tmp_path / "resumed" / "model").state_dict()
    tower = [k for k in start if ".visual." in k and ".merger." not in k]
    assert tower and all(torch.equal(final[k], start[k]) for k in tower)
